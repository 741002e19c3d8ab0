"""CLI: ``rollout`` (the side-by-side rollout: DDTree in a venv beside production, production untouched)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from ddtree_deploy.cli import fleet_ui
from ddtree_deploy.cli.console import env_of
from ddtree_deploy.cli.conventions import Command
from ddtree_deploy.cli.deploy_cmds import AcceptOpt, BuildOpt, HostsArg, InvOpt, JsonOpt, fresh_build
from ddtree_deploy.errors import InventoryError, UsageError

if TYPE_CHECKING:
    from ddtree_deploy.cli.console import Environment
    from ddtree_deploy.remote.inventory import HostConfig
    from ddtree_deploy.remote.side_by_side import RolloutOptions, Wheels


def rollout(
    ctx: typer.Context,
    hosts: Optional[List[str]] = HostsArg,
    all_: bool = typer.Option(False, "--all", help="Every side-by-side host in the inventory."),
    build_dir: Optional[Path] = BuildOpt,
    pristine: bool = typer.Option(
        False, "--pristine", help="Install the pinned wheel itself in the side-by-side venv (the baseline; 'rollback')."
    ),
    remove: bool = typer.Option(
        False, "--remove", help="Run stop_command, then delete the side-by-side venv (only one this tool made)."
    ),
    start: bool = typer.Option(
        True, "--start/--no-start", help="After the install, run restart_command and wait for health_url (default: on)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", "-n", help="Check production and the venv, say what would happen; write nothing."
    ),
    why: Optional[str] = typer.Option(None, "--why", metavar="TEXT", help="Reason, recorded in the host's audit log."),
    accept_new_host_key: bool = AcceptOpt,
    json_: bool = JsonOpt,
    inventory: Optional[Path] = InvOpt,
) -> None:
    """Side-by-side rollout: install the DDTree wheel in a venv beside production, smoke it, start its server.

    For a host that serves traffic. The inventory names the side-by-side host (side_by_side_of = the
    production host, venv = where its venv goes, restart_command/health_url = its own server on its own
    port and GPUs). Production's files are only read: its RECORD is checked before and after (status
    shows it). --pristine installs the pinned wheel there instead; --remove deletes the venv.
    """
    env = env_of(ctx)
    from ddtree_deploy.remote.inventory import load_inventory
    from ddtree_deploy.remote.side_by_side import RolloutOptions, Wheels, remove_pipeline

    if remove and (pristine or build_dir is not None):
        raise UsageError("--remove takes no --build or --pristine", hint="ddtree-deploy rollout HOST --remove")
    if pristine and build_dir is not None:
        raise UsageError("--pristine installs the pinned wheel: it takes no --build", hint="drop --build or --pristine")
    inv = load_inventory(inventory)
    if all_ and not hosts:
        hs = [h for h in inv.hosts.values() if h.is_side_by_side]
        if not hs:
            raise InventoryError(
                f"{inv.path} has no side-by-side host",
                hint="add one (side_by_side_of, venv): docs/deploy.md, 'Side-by-side rollout'",
            )
    else:
        hs = inv.select(list(hosts or []), all_, "rollout")
    opts = RolloutOptions(dry_run=dry_run, accept_new_host_key=accept_new_host_key, start=start, why=why, pristine=pristine)
    if remove:
        results = fleet_ui.run(env, hs, remove_pipeline(opts), title=f"{'dry run: ' if dry_run else ''}rollout --remove")
        code = fleet_ui.finish(env, results, json_mode=json_, extra={"dry_run": dry_run, "action": "remove"})
        raise typer.Exit(code)
    work = Path(tempfile.mkdtemp(prefix="ddtree-rollout-"))
    try:
        if pristine:
            wheels = Wheels(None, work, pristine=True)
            title = "rollout --pristine"
            code = _run(env, hs, wheels, opts, title, json_)
        elif build_dir is not None:
            from ddtree_deploy.remote.hostops import load_build

            code = _run(env, hs, Wheels(load_build(build_dir), work), opts, f"rollout {build_dir}", json_)
        else:
            with fresh_build(env) as bs:
                code = _run(env, hs, Wheels(bs, work), opts, f"rollout {bs.series_id}", json_)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raise typer.Exit(code)


def _run(env: Environment, hs: list[HostConfig], wheels: Wheels, opts: RolloutOptions, title: str, json_: bool) -> int:
    from ddtree_deploy.remote.side_by_side import rollout_pipeline

    results = fleet_ui.run(env, hs, rollout_pipeline(wheels, opts), title=("dry run: " if opts.dry_run else "") + title)
    series = None if wheels.bs is None or opts.pristine else wheels.bs.series_id
    return fleet_ui.finish(
        env,
        results,
        json_mode=json_,
        extra={"dry_run": opts.dry_run, "action": "pristine" if opts.pristine else "install", "series_id": series},
    )


def register(app: typer.Typer) -> None:
    app.command(
        "rollout",
        cls=Command,
        epilog="Example: ddtree-deploy rollout ct129-ddtree --dry-run   (then without --dry-run; --remove to undo)",
    )(rollout)
