"""The project's CLI conventions on top of typer: real metavars in help, usage errors in the
``error:`` / ``fix:`` style.

typer's rich help prints each parameter's Python type (``<bool>`` beside every flag,
``<list[str]>`` beside a repeatable argument). Here a flag shows no value at all, an option shows
its metavar (``--build DIR``), and an argument shows its metavar in the name column only
(``HOST...``). Every command and group is built with :class:`Command` / :class:`Group`, which apply
that when the help is drawn; the metavars themselves are written at each parameter.

A click usage error (a missing argument, an unknown option or command, a bad value) becomes an
``errors.UsageError`` (exit 2) whose hint names the usage line and the command's ``--help``, so
``cli.main`` prints it, and its ``--json`` document, like every other error.
"""

from __future__ import annotations

from typing import Any, Sequence, cast

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from ddtree_deploy.errors import Interrupted, UsageError

try:  # typer >= 0.16 vendors its own click
    from typer._click import Context, Parameter  # type: ignore[import-not-found, attr-defined, unused-ignore]
    from typer._click.exceptions import UsageError as ClickUsageError  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover
    from click import Context, Parameter  # type: ignore[assignment, no-redef, unused-ignore]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment, no-redef, unused-ignore]

PROG = "ddtree-deploy"


def _no_type(ctx: Any) -> None:
    return None


def show_metavars(params: Sequence[Parameter]) -> None:
    """A flag takes no value: no type beside it; an argument's metavar is already its name."""
    for p in params:
        if getattr(p, "is_flag", False) or getattr(p, "count", False):
            p.metavar = ""
        elif isinstance(p, TyperArgument):
            p.display_type_rich = _no_type  # type: ignore[method-assign]


def _env(ctx: Context) -> Any:
    from ddtree_deploy.cli.console import env_of  # console imports typer only; no cycle at import time

    return env_of(cast(typer.Context, ctx))  # typer's Context is click's, subclassed


def _set_verbose(ctx: Context, value: int) -> int:
    if value:
        _env(ctx).verbosity += value
    return value


def _set_quiet(ctx: Context, value: bool) -> bool:
    if value:
        _env(ctx).set_quiet(True)
    return value


def _common_holder(
    verbose: int = typer.Option(
        0,
        "--verbose",
        "-v",
        count=True,
        callback=_set_verbose,
        help="More detail on stderr (the traceback of an unexpected error; -vv: the SSH library's log too).",
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", callback=_set_quiet, help="No progress, notes or tables on stderr (errors still print)."
    ),
) -> None:  # pragma: no cover (never called: it only declares the two options, in typer's own way)
    pass


def common_options() -> list[Parameter]:
    """``-v`` / ``-q``, accepted by every group and command, so they work before or after the
    subcommand (``ddtree-deploy -v push x`` = ``ddtree-deploy push x -v``). Declared once, the typer
    way (``_common_holder``); their values go to the Environment, never to the command function."""
    holder = typer.Typer()
    holder.command()(_common_holder)
    params = [p for p in typer.main.get_command(holder).params if p.name in ("verbose", "quiet")]
    for p in params:
        p.expose_value = False
    return params


class _Common:
    """Mixin: the common options appended to a command's own parameters, and Ctrl-C as an error.

    typer turns a KeyboardInterrupt inside a command into a silent ``Exit(130)``; here it becomes
    ``errors.Interrupted`` instead, so ``cli.main`` says so (and writes its ``--json`` document).
    A ``FleetInterrupted`` keeps the message and hint of the run it stopped."""

    _common: list[Parameter] | None = None

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except KeyboardInterrupt as exc:
            raise Interrupted(str(exc) or "interrupted", hint=getattr(exc, "hint", None)) from None

    def get_params(self, ctx: Context) -> list[Parameter]:
        params: list[Parameter] = super().get_params(ctx)  # type: ignore[misc]
        if self._common is None:
            self._common = common_options()
        taken = {o for p in params for o in getattr(p, "opts", [])}
        return params + [p for p in self._common if not taken.intersection(p.opts)]


class Command(_Common, TyperCommand):
    def format_help(self, ctx: Context, formatter: Any) -> None:
        show_metavars(self.get_params(ctx))
        return super().format_help(ctx, formatter)


class Group(_Common, TyperGroup):
    def format_help(self, ctx: Context, formatter: Any) -> None:
        show_metavars(self.get_params(ctx))
        return super().format_help(ctx, formatter)


def command_context(root: Any, args: Sequence[str]) -> Context:
    """The context of the deepest command that ``args`` name (for an error click raised without one)."""
    cmd, path = root, [PROG]
    for a in args:
        if a.startswith("-"):
            continue
        sub = getattr(cmd, "commands", {}).get(a)
        if sub is None:
            break
        cmd, path = sub, path + [a]
    return Context(cmd, info_name=" ".join(path))


def usage_error(exc: ClickUsageError, root: Any = None, args: Sequence[str] = ()) -> UsageError:
    """click's usage error as the project's: the message, then the usage line and where help is.
    ``root`` and ``args`` (the click command and the argv) find the command when click names none."""
    ctx = exc.ctx
    if ctx is None and root is not None:
        ctx = command_context(root, args)
    path = ctx.command_path if ctx is not None else PROG
    where = path[len(PROG) :].strip() if path.startswith(PROG) else path
    message = exc.format_message().rstrip(".")
    if where:
        message = f"{where}: {message}"
    usage = ""
    if ctx is not None:
        pieces = " ".join(ctx.command.collect_usage_pieces(ctx))
        usage = f"usage: {path} {pieces}; "
    return UsageError(message, hint=f"{usage}see `{path} --help`", details={"usage_error": type(exc).__name__})
