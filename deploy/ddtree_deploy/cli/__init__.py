"""The command line: thin glue over the core. Exit codes are mapped here and only here.

Each ``*_cmds`` module registers its commands on ``app``; the core never imports from ``cli``.
"""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.16 vendors its own click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[import-not-found]
    from typer._click.exceptions import UsageError as ClickUsageError  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[no-redef,assignment]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[no-redef,assignment]

from ddtree_deploy import __version__
from ddtree_deploy.cli import bench_cmds, deploy_cmds, patch_cmds  # each registers its commands on app
from ddtree_deploy.cli.console import Environment, env_of
from ddtree_deploy.cli.conventions import Group, usage_error
from ddtree_deploy.errors import EXIT_INTERRUPTED, EXIT_UNEXPECTED, DDTreeDeployError

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
    verbose: int = typer.Option(
        0, "--verbose", "-v", count=True, help="More detail on stderr (the traceback of an unexpected error)."
    ),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    env_of(ctx).verbosity = verbose


patch_cmds.register(app)
deploy_cmds.register(app, lambda argv, env: main(argv, env=env))
bench_cmds.register(app)


def _report(env: Environment, exc: DDTreeDeployError, json_mode: bool) -> int:
    """An error on stderr as ``error:`` / ``fix:``, and with ``--json`` its document on stdout."""
    env.print_error(exc.message, exc.hint)
    if json_mode:
        env.out_json({"ok": False, "exit_code": int(exc.exit_code), **exc.to_json()})
    return int(exc.exit_code)


def main(argv: list[str] | None = None, *, env: Environment | None = None) -> int:
    """Entry point of the ``ddtree-deploy`` console script. Returns (and exits with) the exit code.

    ``env`` is the invocation's I/O (streams, terminals, colour); by default the process's own.
    """
    args = sys.argv[1:] if argv is None else argv
    env = env if env is not None else Environment()
    json_mode = "--json" in args
    try:
        rv = app(args=args, standalone_mode=False, prog_name="ddtree-deploy", obj=env)
        code = rv if isinstance(rv, int) else 0
    except DDTreeDeployError as exc:
        code = _report(env, exc, json_mode)
    except typer.Exit as exc:  # typer.Exit / explicit exits
        code = exc.exit_code
    except typer.Abort:
        env.err.print("interrupted")
        code = EXIT_INTERRUPTED
    except NoArgsIsHelpError as exc:  # a group or command given nothing: its help (exit 2)
        exc.show(file=env.stderr)
        code = exc.exit_code
    except ClickUsageError as exc:  # bad flags, missing args, no such command: the project's style, exit 2
        code = _report(env, usage_error(exc, typer.main.get_command(app), args), json_mode)
    except ClickException as exc:  # pragma: no cover (click raises no other kind for this app)
        exc.show(file=env.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        env.err.print("interrupted")
        code = EXIT_INTERRUPTED
    except Exception as exc:  # a bug: say so plainly, keep the traceback on -v
        if env.verbosity:
            env.err.print_exception()
        env.err.print(f"[bold red]unexpected error:[/] {type(exc).__name__}: {exc}")
        env.err.print("This is a bug in ddtree-deploy; rerun with -v for the traceback.")
        code = EXIT_UNEXPECTED
    if argv is None:
        sys.exit(code)
    return code
