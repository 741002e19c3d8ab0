"""The command line: thin glue over the core. Exit codes are mapped here and only here.

Each ``*_cmds`` module registers its commands on ``app``; the core never imports from ``cli``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import typer

try:  # typer >= 0.16 vendors its own click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[import-not-found, unused-ignore]
    from typer._click.exceptions import UsageError as ClickUsageError  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[no-redef, assignment, unused-ignore]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[no-redef, assignment, unused-ignore]

from ddtree_deploy import __version__
from ddtree_deploy.cli import bench_cmds, deploy_cmds, patch_cmds, rollout_cmds  # each registers its commands on app
from ddtree_deploy.cli.console import Environment, StdoutClosed, env_of
from ddtree_deploy.cli.conventions import Group, command_context, usage_error
from ddtree_deploy.errors import EXIT_INTERRUPTED, EXIT_UNEXPECTED, DDTreeDeployError, ExitCode
from ddtree_deploy.pin.snapshot import DownloadEvent, observe_downloads
from ddtree_deploy.remote.protocol import ErrorKind

app = typer.Typer(
    cls=Group,
    name="ddtree-deploy",
    help=(
        "Ship DDTree to SGLang eval hosts as a strict patch series against a pinned SGLang.\n\n"
        "Typical flow: `snapshot fetch` (once), `check`, `build`, then `push HOST`, `smoke HOST`, "
        "`rollback HOST`. `demo` runs the whole thing against a throwaway loopback host."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(ctx: typer.Context, value: bool) -> None:
    if value:
        env_of(ctx).out_line(__version__)
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    env_of(ctx)  # -v / -q are on every group and command (cli/conventions.py), before or after the subcommand


patch_cmds.register(app)
deploy_cmds.register(app, lambda argv, env: main(argv, env=env))
rollout_cmds.register(app)
bench_cmds.register(app)


def _report(env: Environment, exc: DDTreeDeployError, json_mode: bool, args: list[str] | None = None) -> int:
    """An error on stderr as ``error:`` / ``fix:``, and with ``--json`` its document on stdout. Bad
    input (exit 2) always gets a ``fix:``: the command's help when the error names no better one."""
    if exc.exit_code == ExitCode.USAGE and not exc.hint:
        path = command_context(typer.main.get_command(app), args or []).command_path
        exc.hint = f"see `{path} --help`"
    env.print_error(exc.message, exc.hint)
    if json_mode:
        env.out_result(exc.details, exit_code=exc.exit_code, error=exc.kind, message=exc.message, hint=exc.hint)
    return int(exc.exit_code)


# Library loggers that would print to stderr (Python's last-resort handler) and, in paramiko's case,
# whole tracebacks (a host that accepts TCP but sends no SSH banner). Shown only with -v (-vv: all).
_LIBRARY_LOGGERS = ("paramiko", "fabric", "invoke")


class _VerboseLogHandler(logging.Handler):
    """Library log records to the current invocation's stderr, only as far as its ``-v`` asks."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.env: Environment | None = None

    def emit(self, record: logging.LogRecord) -> None:
        env = self.env
        if env is None or env.verbosity < 1 or (env.verbosity < 2 and record.levelno < logging.WARNING):
            return
        try:
            env.stderr.write(f"[{record.name}] {record.getMessage()}\n")
        except Exception:
            pass


_LOG_HANDLER = _VerboseLogHandler()


def _route_library_logs(env: Environment | None) -> Environment | None:
    previous = _LOG_HANDLER.env
    _LOG_HANDLER.env = env
    for name in _LIBRARY_LOGGERS:
        lg = logging.getLogger(name)
        lg.propagate = False
        lg.setLevel(logging.DEBUG)
        if _LOG_HANDLER not in lg.handlers:
            lg.addHandler(_LOG_HANDLER)
    return previous


def _download_note(env: Environment, ev: DownloadEvent) -> None:
    if ev.phase == "start":
        env.err.print(f"downloading {ev.what} ({ev.detail}) ...", markup=False, highlight=False)
    elif ev.phase == "done":
        env.err.print(f"downloaded {ev.what} ({ev.detail})", markup=False, highlight=False)


def _terminal_fd(env: Environment) -> int | None:
    """stderr's descriptor when it is a terminal (pip draws its download progress there)."""
    if not env.stderr_isatty or env.quiet:
        return None
    try:
        return env.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _stdout_closed(env: Environment) -> int:
    """The reader of stdout went away (``... | head``): stop quietly. When stdout is the process's
    own, point its descriptor at /dev/null so the interpreter's last flush does not complain."""
    try:
        if env.stdout is sys.stdout or env.stdout is sys.__stdout__:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
    except (OSError, ValueError):
        pass
    return int(ExitCode.OK)


def main(argv: list[str] | None = None, *, env: Environment | None = None) -> int:
    """Entry point of the ``ddtree-deploy`` console script. Returns (and exits with) the exit code.

    ``env`` is the invocation's I/O (streams, terminals, colour); by default the process's own.
    """
    args = sys.argv[1:] if argv is None else argv
    env = env if env is not None else Environment()
    json_mode = "--json" in args
    previous_log_env = _route_library_logs(env)
    try:
        code = _run(args, env, json_mode)
    finally:
        _route_library_logs(previous_log_env)
    if argv is None:
        sys.exit(code)
    return code


def _run(args: list[str], env: Environment, json_mode: bool) -> int:
    """Run the app; every way it can end becomes one exit code here (and only here)."""
    try:
        try:
            with observe_downloads(lambda ev: _download_note(env, ev), progress_fd=lambda: _terminal_fd(env)):
                rv: Any = app(args=args, standalone_mode=False, prog_name="ddtree-deploy", obj=env)
            return rv if isinstance(rv, int) else 0
        except DDTreeDeployError as exc:
            if exc.kind == ErrorKind.INTERRUPTED:
                env.print_error(exc.message, exc.hint)
                if json_mode:
                    env.out_result(exc.details, exit_code=EXIT_INTERRUPTED, error=exc.kind, message=exc.message, hint=exc.hint)
                return int(EXIT_INTERRUPTED)
            return _report(env, exc, json_mode, args)
        except typer.Exit as exc:  # typer.Exit / explicit exits
            return int(exc.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            env.err.print("interrupted")
            if json_mode:
                env.out_result(exit_code=EXIT_INTERRUPTED, error=ErrorKind.INTERRUPTED, message="interrupted")
            return int(EXIT_INTERRUPTED)
        except NoArgsIsHelpError as exc:  # a group or command given nothing: its help (exit 2)
            exc.show(file=env.stderr)
            return int(exc.exit_code)
        except ClickUsageError as exc:  # bad flags, missing args, no such command: the project's style, exit 2
            return _report(env, usage_error(exc, typer.main.get_command(app), args), json_mode)
        except ClickException as exc:  # pragma: no cover (click raises no other kind for this app)
            exc.show(file=env.stderr)
            return int(exc.exit_code)
        except Exception as exc:  # a bug: say so plainly, keep the traceback on -v
            if env.verbosity:
                env.err.print_exception()
            message = f"unexpected error: {type(exc).__name__}: {exc}"
            env.print_error(message, "this is a bug in ddtree-deploy; rerun with -v for the traceback and report it")
            if json_mode:
                env.out_result(exit_code=EXIT_UNEXPECTED, error=ErrorKind.UNEXPECTED, message=message)
            return int(EXIT_UNEXPECTED)
    except StdoutClosed:
        return _stdout_closed(env)
