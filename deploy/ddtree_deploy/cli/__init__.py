"""The command line: thin glue over the core. Exit codes are mapped here and only here.

Each ``*_cmds`` module registers its commands on ``app``; the core never imports from ``cli``.
"""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.16 vendors its own click
    from typer._click.exceptions import ClickException  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    from click import ClickException  # type: ignore[no-redef]

from ddtree_deploy import __version__
from ddtree_deploy.cli import bench_cmds, deploy_cmds, patch_cmds  # each registers its commands on app
from ddtree_deploy.cli.console import err, out_json, print_error
from ddtree_deploy.errors import EXIT_INTERRUPTED, EXIT_UNEXPECTED, DDTreeDeployError

app = typer.Typer(
    name="ddtree-deploy",
    help=(
        "Ship DDTree to SGLang eval hosts as a strict patch series against a pinned SGLang.\n\n"
        "Typical flow: `snapshot fetch` (once), `check`, `build`, then `push HOST`, `smoke HOST`, "
        "`rollback HOST`. `demo` runs the whole thing against a throwaway loopback host."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Set by the global callback; commands read it through ``state``.
state: dict[str, object] = {"verbose": 0, "json_errors": False}


def _version(value: bool) -> None:
    if value:
        print(__version__)
        raise typer.Exit(0)


@app.callback()
def _root(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More detail on stderr (the traceback of an unexpected error)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    state["verbose"] = verbose


patch_cmds.register(app)
deploy_cmds.register(app, lambda argv: main(argv))
bench_cmds.register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ddtree-deploy`` console script. Returns (and exits with) the exit code."""
    args = sys.argv[1:] if argv is None else argv
    json_mode = "--json" in args
    try:
        rv = app(args=args, standalone_mode=False, prog_name="ddtree-deploy")
        code = rv if isinstance(rv, int) else 0
    except DDTreeDeployError as exc:
        code = exc.exit_code
        print_error(exc.message, exc.hint)
        if json_mode:
            out_json({"ok": False, "exit_code": code, **exc.to_json()})
    except typer.Exit as exc:  # typer.Exit / explicit exits
        code = exc.exit_code
    except typer.Abort:
        err.print("interrupted")
        code = EXIT_INTERRUPTED
    except ClickException as exc:  # usage errors: bad flags, missing args
        exc.show(file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        code = EXIT_INTERRUPTED
    except Exception as exc:  # a bug: say so plainly, keep the traceback on -v
        if state.get("verbose"):
            err.print_exception()
        err.print(f"[bold red]unexpected error:[/] {type(exc).__name__}: {exc}")
        err.print("This is a bug in ddtree-deploy; rerun with -v for the traceback.")
        code = EXIT_UNEXPECTED
    if argv is None:
        sys.exit(code)
    return code
