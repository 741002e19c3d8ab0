"""CLI: ``push``, ``smoke``, ``rollback``, ``status``, ``history``, ``lock``, ``demo`` (the remote half)."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional

import typer
from rich.table import Table

from ddtree_deploy.cli import fleet_ui
from ddtree_deploy.cli.console import Environment, env_of
from ddtree_deploy.cli.conventions import Command, Group
from ddtree_deploy.errors import UsageError

if TYPE_CHECKING:
    from ddtree_deploy.remote.hostops import BuildSet
    from ddtree_deploy.remote.inventory import HostConfig

HostsArg = typer.Argument(None, metavar="HOST", help="Host names from the inventory.", show_default=False)
AllOpt = typer.Option(False, "--all", help="Every host in the inventory.")
InvOpt = typer.Option(
    None,
    "--inventory",
    "-i",
    envvar="DDTREE_DEPLOY_INVENTORY",
    metavar="FILE",
    help="Inventory TOML (default: deploy/hosts.toml).",
)
JsonOpt = typer.Option(False, "--json", help="Machine-readable result on stdout.")
BuildOpt = typer.Option(
    None, "--build", "-b", metavar="DIR", help="A build directory (manifest.json + files); default: build now."
)
AcceptOpt = typer.Option(
    False,
    "--accept-new-host-key",
    help="Record a host key seen for the first time in that host's known_hosts (a changed key is always refused).",
)

lock_app = typer.Typer(
    cls=Group, help="The deploy lock on a host: `status` shows the holder, `release` frees it.", no_args_is_help=True
)


def _hosts(
    inventory: Optional[Path],
    names: Optional[List[str]],
    all_: bool,
    command: str,
    *,
    in_place: bool = False,
    writes_live: bool = False,
    env: Optional[Environment] = None,
) -> list[HostConfig]:
    """The hosts named (or ``--all``); ``in_place`` commands (push, rollback) leave side-by-side hosts
    out of ``--all`` (``rollout`` installs those) and refuse them by name; ``writes_live`` (push) also
    leaves out, and refuses by name, hosts that serve traffic (unless their entry has allow_in_place)."""
    from ddtree_deploy.errors import InventoryError
    from ddtree_deploy.remote.inventory import load_inventory
    from ddtree_deploy.remote.push import refuse_serving, refuse_side_by_side

    hs = load_inventory(inventory).select(list(names or []), all_, command)
    if in_place and all_:
        skipped = [h.name for h in hs if writes_live and h.in_place_refused]
        hs = [h for h in hs if not h.is_side_by_side and h.name not in skipped]
        if skipped and env is not None:
            env.err.print(
                f"{command} --all leaves out {', '.join(skipped)} (serving traffic; `rollout` installs DDTree beside it)",
                markup=False,
            )
        if not hs:
            raise InventoryError(
                f"{command} --all: the inventory has no host to patch in place"
                + (f" ({', '.join(skipped)} serve traffic)" if skipped else " (only side-by-side hosts)"),
                hint="ddtree-deploy rollout --all",
            )
    for h in hs if in_place else []:
        refuse_side_by_side(h, command)
        if writes_live:
            refuse_serving(h, command)
    return hs


@contextmanager
def _build_set(env: Environment, build_dir: Optional[Path]) -> Iterator[BuildSet]:
    """The build to push: ``--build DIR``, else a fresh build of the repo's series in a temp dir."""
    from ddtree_deploy.remote.hostops import load_build

    if build_dir is not None:
        yield load_build(build_dir)
        return
    with fresh_build(env) as bs:
        yield bs


@contextmanager
def fresh_build(env: Environment) -> Iterator[BuildSet]:
    from ddtree_deploy.build.build import build
    from ddtree_deploy.paths import cache_dir
    from ddtree_deploy.remote.hostops import load_build

    base = cache_dir() / "push-builds"
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=base))
    try:
        env.err.print(f"building the series into {tmp} ...")
        build(tmp)
        yield load_build(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _exit(code: int) -> None:
    if code:
        raise typer.Exit(code)


def push(
    ctx: typer.Context,
    hosts: Optional[List[str]] = HostsArg,
    all_: bool = AllOpt,
    build_dir: Optional[Path] = BuildOpt,
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="Preflight only: show a diff per file, write nothing."),
    accept_new_host_key: bool = AcceptOpt,
    restart: bool = typer.Option(
        False, "--restart", help="Then run the host's restart_command, wait for health_url, smoke again."
    ),
    no_rollback: bool = typer.Option(False, "--no-rollback", help="With --restart: keep the deploy if the health check fails."),
    why: Optional[str] = typer.Option(None, "--why", metavar="TEXT", help="Reason, recorded in the lock and the audit log."),
    diff_lines: Optional[int] = typer.Option(
        None, "--diff-lines", min=0, metavar="N", help="With --dry-run: show at most N lines of each file's diff (default: all)."
    ),
    json_: bool = JsonOpt,
    inventory: Optional[Path] = InvOpt,
) -> None:
    """Push the patched files to hosts: preflight, lock, backup, atomic upload, compile + smoke, audit.

    Any failure after the first write restores the host from its backup and verifies it (exit 8).
    """
    env = env_of(ctx)
    from ddtree_deploy.remote.hostops import test_hooks
    from ddtree_deploy.remote.push import PushOptions, push_pipeline

    test_hooks()  # refuses a hook that does not exist (only delays do) before anything runs
    hs = _hosts(inventory, hosts, all_, "push", in_place=True, writes_live=True, env=env)
    if no_rollback and not restart:
        raise UsageError("--no-rollback only applies together with --restart")
    with _build_set(env, build_dir) as bs:
        opts = PushOptions(
            dry_run=dry_run, accept_new_host_key=accept_new_host_key, restart=restart, no_rollback=no_rollback, why=why
        )
        title = f"{'dry run: ' if dry_run else ''}push {bs.series_id}"
        results = fleet_ui.run(env, hs, push_pipeline(bs, opts), title=title)
        if dry_run and not json_:
            for r in results:
                for path, diff in (r.data.get("diffs") or {}).items():
                    env.out_line(f"# {r.host}: {path}")
                    lines = diff.rstrip("\n").split("\n") if diff else []
                    if diff_lines is not None and len(lines) > diff_lines:
                        lines = lines[:diff_lines] + [f"# ... {len(lines) - diff_lines} more diff line(s)"]
                    if lines:
                        env.out_line("\n".join(lines))
        code = fleet_ui.finish(env, results, json_mode=json_, extra={"series_id": bs.series_id, "dry_run": dry_run})
    _exit(code)


def smoke(
    ctx: typer.Context,
    hosts: Optional[List[str]] = HostsArg,
    all_: bool = AllOpt,
    build_dir: Optional[Path] = typer.Option(None, "--build", "-b", metavar="DIR", help="Also use this build's module list."),
    accept_new_host_key: bool = AcceptOpt,
    json_: bool = JsonOpt,
    inventory: Optional[Path] = InvOpt,
) -> None:
    """Re-run py_compile + the smoke import on what is deployed (changes nothing; exit 12 if it fails)."""
    env = env_of(ctx)
    from ddtree_deploy.remote.hostops import load_build
    from ddtree_deploy.remote.push import smoke_pipeline

    hs = _hosts(inventory, hosts, all_, "smoke")
    bs = load_build(build_dir) if build_dir else None
    results = fleet_ui.run(env, hs, smoke_pipeline(bs, accept_new_host_key), title="smoke")
    _exit(fleet_ui.finish(env, results, json_mode=json_))


def rollback(
    ctx: typer.Context,
    hosts: Optional[List[str]] = HostsArg,
    all_: bool = AllOpt,
    to: Optional[str] = typer.Option(
        None, "--to", metavar="DEPLOY_ID", help="Undo every deploy after DEPLOY_ID (or 'pristine': undo all)."
    ),
    why: Optional[str] = typer.Option(None, "--why", metavar="TEXT", help="Reason, recorded in the audit log."),
    dry_run: bool = typer.Option(
        False, "--dry-run", "-n", help="Check every backup and file and say what would be restored; write nothing."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Also restore files edited on the host after the deploy (a copy of each is kept in the state dir first).",
    ),
    restart: bool = typer.Option(
        False,
        "--restart",
        help="Then run the host's restart_command and wait for health_url (audited), as push --restart does. "
        "Without it a running service keeps the patched code it loaded until it restarts.",
    ),
    accept_new_host_key: bool = AcceptOpt,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before rolling several hosts back to pristine."),
    json_: bool = JsonOpt,
    inventory: Optional[Path] = InvOpt,
) -> None:
    """Undo the latest deploy (or back to --to DEPLOY_ID) byte-exactly from the host's backups, verified.

    Every backup and every current file is checked before the first write: a broken backup (exit 9) or
    a file edited on the host since the deploy (exit 6, unless --force) refuses with the host untouched.
    Restoring files does not restart a running server: it keeps the patched code it loaded. --restart
    runs the host's restart_command and waits for its health_url (exit 12 if it does not get healthy).
    """
    env = env_of(ctx)
    from ddtree_deploy.remote.push import rollback_pipeline

    hs = _hosts(inventory, hosts, all_, "rollback", in_place=True)
    if to == "pristine" and len(hs) > 1 and not dry_run and not yes:
        _confirm_pristine(env, [h.name for h in hs])
    results = fleet_ui.run(
        env,
        hs,
        rollback_pipeline(to, accept_new_host_key, why, dry_run=dry_run, force=force, restart=restart),
        title="dry run: rollback" if dry_run else "rollback",
    )
    _exit(fleet_ui.finish(env, results, json_mode=json_, extra={"dry_run": dry_run, "restart": restart}))


def _confirm_pristine(env: Environment, names: List[str]) -> None:
    """Several hosts back to pristine undoes every deploy on each: ask on a terminal, else demand --yes."""
    what = f"roll {len(names)} hosts ({', '.join(names)}) back to pristine, undoing every deploy on each"
    if not env.stdin_isatty:
        raise UsageError(
            f"refusing to {what} without confirmation (stdin is not a terminal)", hint="add --yes (or check first with --dry-run)"
        )
    if not env.confirm(f"{what}?"):
        raise UsageError("rollback cancelled; nothing was changed", hint="add --yes to skip the question")


def status(
    ctx: typer.Context,
    hosts: Optional[List[str]] = HostsArg,
    all_: bool = AllOpt,
    build_dir: Optional[Path] = typer.Option(
        None, "--build", "-b", metavar="DIR", help="Compare against this build (default: the host's records only)."
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 14 when a host is drifted, interrupted or needs a human (for cron and CI)."
    ),
    accept_new_host_key: bool = AcceptOpt,
    json_: bool = JsonOpt,
    inventory: Optional[Path] = InvOpt,
) -> None:
    """Per file: pristine / patched (which series) / unknown (drifted); the lock and the last deploy.

    Exit 0 when every host answered; with --strict, exit 14 when any host needs attention.
    """
    env = env_of(ctx)
    from ddtree_deploy.errors import AttentionError
    from ddtree_deploy.remote.hostops import load_build
    from ddtree_deploy.remote.push import record_phrase, status_pipeline

    hs = _hosts(inventory, hosts, all_, "status")
    bs = load_build(build_dir) if build_dir else None
    results = fleet_ui.run(env, hs, status_pipeline(bs, accept_new_host_key), title="status", quiet=True)
    if not json_:
        for r in results:
            if not r.ok:
                continue
            st = r.data
            t = Table(title=f"{r.host}: sglang {st.get('package_version')} in {st.get('site_packages')}")
            for c in ("file", "state", "series", "sha256"):
                t.add_column(c, no_wrap=True)
            for f in st["files"]:
                color = {"pristine": "cyan", "patched": "green", "ours": "green"}.get(f["state"], "red")
                t.add_row(f["path"], f"[{color}]{f['state']}[/]", f["series"] or "", (f["sha256"] or "(absent)")[:16])
            if st["files"]:
                env.err.print(t)
            env.err.print(record_phrase(st["record"]), markup=False, highlight=False)
            lk = st.get("lock")
            env.err.print(f"lock: {'held by ' + str(lk.get('who')) + ' (' + str(lk.get('deploy_id')) + ')' if lk else 'free'}")
            ld = st.get("last_deploy")
            env.err.print(
                f"last deploy: {ld['deploy_id'] + ' ' + ld['status'] + ' ' + str(ld.get('series_id')) if ld else 'none'}"
            )
            if st.get("interrupted"):
                env.err.print(f"[bold red]interrupted deploy {st['interrupted'][-1]}[/]: run `ddtree-deploy rollback {r.host}`")
            env.out_line(f"{r.host}\t{r.message}")
    attention = [r for r in results if r.ok and r.status == "attention"]
    if strict:
        for r in attention:
            env.err.print(f"{r.host}: needs attention: {r.message}", markup=False, highlight=False)
    code = fleet_ui.finish(
        env,
        results,
        json_mode=json_,
        quiet=True,
        extra={"attention": [r.host for r in attention]},
        ok_code=AttentionError.exit_code if strict and attention else 0,
    )
    _exit(code)


def history(
    ctx: typer.Context,
    host: str = typer.Argument(..., metavar="HOST", help="A host name from the inventory."),
    limit: Optional[int] = typer.Option(None, "--limit", metavar="N", help="Only the last N entries."),
    accept_new_host_key: bool = AcceptOpt,
    json_: bool = JsonOpt,
    inventory: Optional[Path] = InvOpt,
) -> None:
    """The host's audit log: one line per deploy, rollback and lock release."""
    env = env_of(ctx)
    from ddtree_deploy.remote.push import history_pipeline

    hs = _hosts(inventory, [host], False, "history")
    results = fleet_ui.run(env, hs, history_pipeline(limit, accept_new_host_key), title="history", quiet=True)
    r = results.results[0]
    if r.ok and not json_:
        for e in r.data["entries"]:
            target = e.get("undo") or ""
            env.out_line(
                "\t".join(
                    str(x)
                    for x in (
                        e.get("time"),
                        e.get("op"),
                        e.get("deploy_id"),
                        e.get("who"),
                        e.get("series_id") or "",
                        target,
                        e.get("result"),
                    )
                )
            )
    _exit(fleet_ui.finish(env, results, json_mode=json_, quiet=True))


@lock_app.command("status", cls=Command, epilog="Example: ddtree-deploy lock status gpu1")
def lock_status(
    ctx: typer.Context,
    hosts: Optional[List[str]] = HostsArg,
    all_: bool = AllOpt,
    json_: bool = JsonOpt,
    inventory: Optional[Path] = InvOpt,
) -> None:
    """Who holds the deploy lock on each host (who/when/why/deploy id, and whether it is alive)."""
    env = env_of(ctx)
    from ddtree_deploy.remote.push import lock_pipeline

    results = fleet_ui.run(env, _hosts(inventory, hosts, all_, "lock status"), lock_pipeline("status"), title="lock", quiet=True)
    if not json_:
        for r in results:
            if r.ok:
                env.out_line(f"{r.host}\t{r.status}\t{r.message}")
    _exit(fleet_ui.finish(env, results, json_mode=json_, quiet=True))


@lock_app.command("release", cls=Command, epilog="Example: ddtree-deploy lock release gpu1 --dry-run")
def lock_release(
    ctx: typer.Context,
    hosts: List[str] = typer.Argument(..., metavar="HOST", help="Host names."),
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="Show whose lock would be released; write nothing."),
    json_: bool = JsonOpt,
    inventory: Optional[Path] = InvOpt,
) -> None:
    """Free a deploy lock left behind (recorded in the audit log). Check `status` first."""
    env = env_of(ctx)
    from ddtree_deploy.remote.push import lock_pipeline

    results = fleet_ui.run(
        env,
        _hosts(inventory, hosts, False, "lock release"),
        lock_pipeline("release", dry_run=dry_run),
        title="lock release",
        quiet=True,
    )
    if not json_:
        for r in results:
            if r.ok:
                env.out_line(f"{r.host}\t{r.status}\t{r.message}")
    _exit(fleet_ui.finish(env, results, json_mode=json_, quiet=True))


def demo(
    ctx: typer.Context,
    keep: bool = typer.Option(False, "--keep", help="Keep the demo's temp directory (and print where)."),
    build_dir: Optional[Path] = typer.Option(
        None, "--build", "-b", metavar="DIR", help="Use this build (made with build --wheel; default: build the series)."
    ),
    full_smoke: bool = typer.Option(
        True,
        "--full-smoke/--light-smoke",
        help="Smoke-import the patched modules under SGLang's real deps (slower; only when they are installed), or only compile.",
    ),
    json_: bool = JsonOpt,
) -> None:
    """A throwaway loopback host with the pinned SGLang: the side-by-side rollout, then push -> status -> smoke -> rollback.

    Everything it makes lives in a temp directory that it removes (unless --keep); it writes nothing else.
    """
    env = env_of(ctx)
    from ddtree_deploy.cli.console import Environment
    from ddtree_deploy.cli.demo import run_demo
    from ddtree_deploy.remote.protocol import ErrorKind

    if build_dir is not None and not (Path(build_dir) / "manifest.json").is_file():
        raise UsageError(
            f"--build {build_dir} is not a build directory (no manifest.json)",
            hint="ddtree-deploy build --wheel --out DIR, then ddtree-deploy demo --build DIR (or leave --build out)",
        )
    # with --json the steps' own output goes to stderr, so stdout holds one document
    inner = Environment(
        stdin=env.stdin,
        stdout=env.stderr if json_ else env.stdout,
        stderr=env.stderr,
        stdin_isatty=env.stdin_isatty,
        stdout_isatty=env.stderr_isatty if json_ else env.stdout_isatty,
        stderr_isatty=env.stderr_isatty,
        colors=env.colors,
        verbosity=env.verbosity,
    )
    code, steps = run_demo(lambda argv: _run_cli(argv, inner), env, keep=keep, build_dir=build_dir, full_smoke=full_smoke)
    if json_:
        env.out_result(
            {"steps": steps},
            exit_code=code,
            error=None if code == 0 else ErrorKind.DEMO_STEP,
            message="demo ok" if code == 0 else "a demo step did not end as expected (see steps)",
            hint=None if code == 0 else "ddtree-deploy demo --keep -v",
        )
    _exit(code)


# The CLI entry point, handed in by ``cli/__init__`` at registration: the demo drives the real CLI
# without importing ``ddtree_deploy.cli`` (which would be an import cycle).
_run_cli: Callable[[list[str], Environment], int] = lambda argv, env: 2  # noqa: E731  (replaced by register)


def register(app: typer.Typer, run_cli: Callable[[list[str], Environment], int]) -> None:
    global _run_cli
    _run_cli = run_cli
    app.command("push", cls=Command, epilog="Example: ddtree-deploy push gpu1 --dry-run")(push)
    app.command("smoke", cls=Command, epilog="Example: ddtree-deploy smoke gpu1")(smoke)
    app.command(
        "rollback",
        cls=Command,
        epilog='Example: ddtree-deploy rollback gpu1 --why "bad tau"   (several hosts to pristine: --all --to pristine --yes)',
    )(rollback)
    app.command("status", cls=Command, epilog="Example: ddtree-deploy status --all --strict")(status)
    app.command("history", cls=Command, epilog="Example: ddtree-deploy history gpu1")(history)
    app.add_typer(lock_app, name="lock")
    app.command("demo", cls=Command, epilog="Example: ddtree-deploy demo --light-smoke")(demo)
