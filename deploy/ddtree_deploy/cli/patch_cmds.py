"""CLI: ``snapshot``, ``check``, ``build`` and ``patches`` (the local half of the tool)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from ddtree_deploy.build.build import (
    apply_checked,
    resolve_inputs,
)
from ddtree_deploy.build.build import (
    build as build_tree,
)
from ddtree_deploy.build.build import (
    check as check_series,
)
from ddtree_deploy.cli.console import env_of
from ddtree_deploy.cli.conventions import Command, Group
from ddtree_deploy.errors import UsageError
from ddtree_deploy.patches import authoring
from ddtree_deploy.patches.series import load_series
from ddtree_deploy.paths import cache_dir, default_pin_path, default_series_dir
from ddtree_deploy.pin import snapshot as snap
from ddtree_deploy.pin.pin import Pin, load_pin

SeriesOpt = typer.Option(None, "--series", metavar="DIR", help="Series directory (default: patches/sglang-<pinned version>).")
PinOpt = typer.Option(None, "--pin", metavar="FILE", help="Pin file (default: snapshot/sglang-<version>.toml).")
JsonOpt = typer.Option(False, "--json", help="Machine-readable result on stdout.")

snapshot_app = typer.Typer(
    cls=Group,
    help="The pinned SGLang snapshot: fetch the wheel from PyPI, verify it, unpack it into the cache.",
    no_args_is_help=True,
)
patches_app = typer.Typer(
    cls=Group,
    help="Author the series with git: `edit` makes a work tree (one commit per patch), `refresh` writes it back.",
    no_args_is_help=True,
)


def _pin(pin_path: Optional[Path]) -> Pin:
    return load_pin(_existing_file(pin_path, "--pin") or default_pin_path())


def _existing_file(path: Optional[Path], flag: str) -> Optional[Path]:
    """Bad input is refused where it enters (exit 2), before it can look like another error."""
    if path is not None and not Path(path).is_file():
        raise UsageError(
            f"{flag} {path}: " + ("is a directory, not a file" if Path(path).is_dir() else "no such file"),
            hint=f"pass an existing file to {flag}",
        )
    return path


def _existing_dir(path: Optional[Path], flag: str) -> Optional[Path]:
    if path is not None and not Path(path).is_dir():
        raise UsageError(
            f"{flag} {path}: " + ("is a file, not a directory" if Path(path).exists() else "no such directory"),
            hint=f"pass an existing directory to {flag}",
        )
    return path


def _series_dir(path: Optional[Path]) -> Optional[Path]:
    """``--series DIR``: an existing directory holding a ``series`` file (``.`` is the current one)."""
    if path is None:
        return None
    _existing_dir(path, "--series")
    d = Path(path).resolve()
    if not (d / "series").is_file():
        raise UsageError(
            f"--series {path}: {d} is not a series directory (it has no 'series' file)",
            hint="pass the directory that holds the series file, e.g. --series patches/sglang-0.5.23",
        )
    return d


def _pin_arg(pin: Optional[Path]) -> Pin | bool:
    return load_pin(_existing_file(pin, "--pin") or pin) if pin else True


@snapshot_app.command("fetch", cls=Command, epilog="Example: ddtree-deploy snapshot fetch")
def snapshot_fetch(
    ctx: typer.Context,
    wheel: Optional[Path] = typer.Option(
        None, "--wheel", metavar="FILE", help="Use this local wheel file instead of downloading."
    ),
    python_version: Optional[str] = typer.Option(
        None, "--python-version", metavar="X.Y", help="Fetch the wheel for another Python (e.g. 3.12), as a host would use."
    ),
    pin: Optional[Path] = PinOpt,
    dry_run: bool = typer.Option(
        False, "--dry-run", "-n", help="Say whether the wheel is cached or would be downloaded, and where; write nothing."
    ),
    json_: bool = JsonOpt,
) -> None:
    """Download the pinned wheel (pip, no deps), check its sha256, unpack sglang/ into the cache."""
    env = env_of(ctx)
    p = _pin(pin)
    _existing_file(wheel, "--wheel")
    if dry_run:
        plan = snap.fetch_plan(p, wheel=wheel, python_version=python_version)
        message = f"dry run: {plan['action']} {plan['wheel']} into {plan['cache']}; wrote nothing"
        env.err.print(message, markup=False, highlight=False)
        if json_:
            env.out_result({**plan, "dry_run": True}, message=message)
        return
    env.err.print(f"fetching {p.requirement} into {cache_dir()} ...", markup=False)
    s = snap.fetch(p, wheel=wheel, python_version=python_version)
    verified = snap.verify_tree(p, s.root)
    message = f"{s.wheel.filename} sha256 verified; {len(verified)} pinned file(s) verified"
    env.err.print(f"[green]ok[/] {message}")
    if json_:
        env.out_result(
            {"wheel": s.wheel.filename, "sha256": s.wheel.sha256, "root": str(s.root), "verified": verified}, message=message
        )
    else:
        env.out_line(str(s.root))


@snapshot_app.command("verify", cls=Command, epilog="Example: ddtree-deploy snapshot verify --json")
def snapshot_verify(ctx: typer.Context, pin: Optional[Path] = PinOpt, json_: bool = JsonOpt) -> None:
    """Re-hash the cached snapshot's pinned files against the pin."""
    env = env_of(ctx)
    p = _pin(pin)
    s = snap.find_snapshot(p)
    verified = snap.verify_tree(p, s.root)
    message = f"{len(verified)} pinned file(s) match {p.path}"
    env.err.print(f"[green]ok[/] {message}")
    if json_:
        env.out_result({"root": str(s.root), "verified": verified}, message=message)


@snapshot_app.command("path", cls=Command, epilog='Example: ls "$(ddtree-deploy snapshot path)/sglang"')
def snapshot_path(ctx: typer.Context, pin: Optional[Path] = PinOpt, json_: bool = JsonOpt) -> None:
    """Print the cached snapshot's directory (the one that contains sglang/)."""
    env = env_of(ctx)
    root = str(snap.find_snapshot(_pin(pin)).root)
    if json_:
        env.out_result({"root": root}, message=root)
    else:
        env.out_line(root)


@snapshot_app.command("pin", cls=Command, epilog="Example: ddtree-deploy snapshot pin --dry-run")
def snapshot_pin(
    ctx: typer.Context,
    series: Optional[Path] = SeriesOpt,
    pin: Optional[Path] = PinOpt,
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="Show the new [files] table, write nothing."),
    json_: bool = JsonOpt,
) -> None:
    """Record in the pin the pristine sha256 of every file the series touches (from the verified snapshot)."""
    env = env_of(ctx)
    p = _pin(pin)
    s = snap.find_snapshot(p)
    ser = load_series(_series_dir(series) or default_series_dir(p.version))
    files = authoring.pin_files(p, ser, s.root)
    added = sorted(set(files) - set(p.files))
    dropped = sorted(set(p.files) - set(files))
    for rel in added:
        env.err.print(f"  + {rel} = {files[rel]}")
    for rel in dropped:
        env.err.print(f"  - {rel}")
    data = {"pin": str(p.path), "files": len(files), "added": added, "dropped": dropped, "dry_run": dry_run}
    if dry_run:
        env.err.print("dry run: pin not written")
        if json_:
            env.out_result(data, message=f"dry run: {len(added)} added, {len(dropped)} dropped; pin not written")
        return
    p.files = files
    p.save()
    message = f"{p.path}: {len(files)} file(s) pinned ({len(added)} added, {len(dropped)} dropped)"
    env.err.print("[green]ok[/]", end=" ")
    env.err.print(message, markup=False)
    if json_:
        env.out_result(data, message=message)


def check_cmd(
    ctx: typer.Context,
    series: Optional[Path] = SeriesOpt,
    against: Optional[Path] = typer.Option(
        None,
        "--against",
        metavar="DIR",
        help="A pristine tree (a dir containing sglang/, e.g. a site-packages) instead of the snapshot.",
    ),
    pin: Optional[Path] = PinOpt,
    json_: bool = JsonOpt,
) -> int:
    """Apply the whole series exactly (zero fuzz, zero offset) and compile it; write nothing.

    Exits 0 when every patch applies and every patched .py file compiles; otherwise the
    documented code (4: a patch does not apply; 5: compile error; 3: base differs from the pin).
    """
    env = env_of(ctx)
    inputs = resolve_inputs(_series_dir(series), _existing_dir(against, "--against"), _pin_arg(pin))
    rep = check_series(inputs)
    if json_:
        e = rep.error or {}
        data = {k: v for k, v in rep.to_json().items() if k not in ("ok", "exit_code", "error")}
        data.update({k: v for k, v in e.items() if k not in ("error", "message", "hint")})
        message = (
            f"{rep.series_id}: {len(rep.patches)} patch(es) apply exactly; {len(rep.compiled)} .py file(s) compile"
            if rep.ok
            else e.get("message", "check failed")
        )
        env.out_result(data, exit_code=rep.exit_code, error=e.get("error"), message=message, hint=e.get("hint"))
    for pr in rep.patches:
        colour = {"applied": "green", "failed": "red", "compile-error": "red"}.get(pr.status, "yellow")
        env.err.print(f"  [{colour}]{pr.status:<13}[/] {pr.name}")
    for name in rep.unlisted:
        env.err.print(f"  [yellow]warning[/] {name} is in the series dir but not in the series file")
    if rep.ok:
        env.err.print(
            f"[green]ok[/] {rep.series_id}: {len(rep.patches)} patch(es) apply exactly; {len(rep.compiled)} .py file(s) compile"
        )
        return 0
    e = rep.error or {}
    env.print_error(e.get("message", "check failed"), e.get("hint"))
    raise typer.Exit(rep.exit_code)


def build_cmd(
    ctx: typer.Context,
    out: Path = typer.Option(
        Path("build/sglang-0.5.23"),
        "--out",
        metavar="DIR",
        help="Output directory: new, empty, or a previous build (replaced whole); anything else is refused without --force.",
    ),
    series: Optional[Path] = SeriesOpt,
    against: Optional[Path] = typer.Option(
        None, "--against", metavar="DIR", help="Build on this pristine tree instead of the snapshot."
    ),
    pin: Optional[Path] = PinOpt,
    wheel: bool = typer.Option(
        False,
        "--wheel",
        help="Also write sglang-<version>+ddtree.<series hash>-*.whl (the pinned wheel with the patched files and "
        "a correct RECORD) and a hash-pinned requirements.txt into DIR, for a side-by-side venv (rollout).",
    ),
    python_version: Optional[str] = typer.Option(
        None, "--python-version", metavar="X.Y", help="With --wheel: the pinned wheel for this Python (default: this one's)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace --out even if it is not a previous build (its contents are lost)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", "-n", help="Apply and compile in memory, say what would be written where; write nothing."
    ),
    json_: bool = JsonOpt,
) -> None:
    """Write the patched files (package-relative) and manifest.json, after py_compile of every .py."""
    env = env_of(ctx)
    from ddtree_deploy.build.build import out_dir_action

    if python_version and not wheel:
        raise UsageError("--python-version only applies together with --wheel", hint="add --wheel, or drop --python-version")
    action = out_dir_action(out, force=force)
    pinned = None
    if wheel and not dry_run:
        p = _pin(pin)
        pinned = snap.pinned_wheel_file(p, python_version)
    m = build_tree(
        out,
        series_dir=_series_dir(series),
        base_dir=_existing_dir(against, "--against"),
        pin=_pin_arg(pin),
        force=force,
        dry_run=dry_run,
        wheel=pinned,
    )
    out_abs = Path(out).absolute()
    data: dict[str, Any] = {"out": str(out_abs), "out_action": action, "dry_run": dry_run, **m.to_json()}
    what = {"new": "a new directory", "empty": "an empty directory", "previous-build": "replacing a previous build"}
    where = f"{out} ({what.get(action, 'REPLACING it (--force)')})"
    if dry_run:
        message = f"dry run: {m.series_id}: {len(m.files)} file(s) + manifest.json would be written to {where}; wrote nothing"
    else:
        message = f"{m.series_id}: {len(m.files)} file(s) written to {where} (+ manifest.json)"
    if wheel and not dry_run:
        from ddtree_deploy.build.wheel import read_wheel_info

        wi = read_wheel_info(out_abs)
        data["wheel"] = wi.to_json()
        message += f"; wheel {wi.filename} (sha256 {wi.sha256})"
    if json_:
        env.out_result(data, message=message)
    else:
        env.out_line(str(out_abs))
    if not dry_run:
        env.err.print("[green]ok[/]", end=" ")
    env.err.print(message, markup=False, highlight=False, soft_wrap=True)


@patches_app.command("edit", cls=Command, epilog="Example: ddtree-deploy patches edit --work .work/series")
def patches_edit(
    ctx: typer.Context,
    work: Path = typer.Option(None, "--work", metavar="DIR", help="Work tree to create (default: .work/sglang in the repo)."),
    series: Optional[Path] = SeriesOpt,
    force: bool = typer.Option(False, "--force", help="Replace an existing work tree (its edits are lost)."),
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="Say which work tree would be made; write nothing."),
    json_: bool = JsonOpt,
) -> None:
    """Make a git work tree: the pristine package, then one commit per patch (subject = file name)."""
    env = env_of(ctx)
    inputs = resolve_inputs(_series_dir(series), None, True)
    work = work or authoring.default_work_dir()
    if dry_run:
        exists = Path(work).exists()
        if exists and not force:
            authoring.refuse_existing_work(Path(work))
        message = (
            f"dry run: would {'REPLACE' if exists else 'make'} {work}: a pristine commit + "
            f"{len(inputs.series.patches)} patch commit(s); wrote nothing"
        )
        env.err.print(message, markup=False)
        if json_:
            env.out_result(
                {"work_dir": str(work), "patches": [p.name for p in inputs.series.patches], "dry_run": True}, message=message
            )
        return
    base = inputs.base_dir or snap.ensure_snapshot(inputs.pin)
    label = f"{inputs.pin.name} {inputs.pin.version}" if inputs.pin is not None else f"pristine base {base}"
    res = authoring.edit(work, inputs.series, base, label, force=force)
    message = f"{res.work_dir}: pristine commit {res.base_commit[:12]} + {len(res.patches)} patch commit(s)"
    if json_:
        env.out_result(
            {"work_dir": str(res.work_dir), "base_commit": res.base_commit, "patches": list(res.patches), "dry_run": False},
            message=message,
        )
    else:
        env.out_line(str(res.work_dir))
    env.err.print("[green]ok[/]", end=" ")
    env.err.print(message, markup=False)
    env.err.print(
        "edit with git (one commit per patch; the subject is the patch file name), then `ddtree-deploy patches refresh`"
    )


@patches_app.command("refresh", cls=Command, epilog="Example: ddtree-deploy patches refresh --work .work/series")
def patches_refresh(
    ctx: typer.Context,
    work: Path = typer.Option(None, "--work", metavar="DIR", help="Work tree made by `patches edit` (default: .work/sglang)."),
    series: Optional[Path] = SeriesOpt,
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="Say what would change; write nothing."),
    json_: bool = JsonOpt,
) -> None:
    """Write the work tree's commits back as patches + series, update the pin, then re-check."""
    env = env_of(ctx)
    work = work or authoring.default_work_dir()
    series = _series_dir(series)
    res = authoring.refresh(work, series, dry_run=dry_run)
    for n in res.written:
        env.err.print(f"  [green]wrote[/]     {n}")
    for n in res.unchanged:
        env.err.print(f"  unchanged {n}")
    for n in res.removed:
        env.err.print(f"  [yellow]removed[/]   {n}")
    if not dry_run:
        p = load_pin(default_pin_path())
        ser = load_series(Path(series or authoring.work_state(work)["series_dir"]))
        repo_series = ser.directory.resolve() == default_series_dir(p.version).resolve()
        if repo_series:
            files = authoring.pin_files(p, ser, snap.ensure_snapshot(p))
            if files != p.files:
                p.files = files
                p.save()
                env.err.print(f"  [green]updated[/]   {p.path} ([files] now lists {len(files)} file(s))")
        else:
            env.err.print(f"  (the pin is not updated: {ser.directory} is not the repo's series)")
        apply_checked(resolve_inputs(ser.directory, None, p if repo_series else False))
        env.err.print("[green]ok[/] the refreshed series applies and compiles")
    if json_:
        env.out_result(
            {
                "written": res.written,
                "unchanged": res.unchanged,
                "removed": res.removed,
                "series_rewritten": res.series_rewritten,
                "dry_run": dry_run,
            },
            message=f"{'dry run: ' if dry_run else ''}{len(res.written)} written, {len(res.unchanged)} unchanged, "
            f"{len(res.removed)} removed",
        )


@patches_app.command("list", cls=Command, epilog="Example: ddtree-deploy patches list | cut -f3 | sort -u")
def patches_list(ctx: typer.Context, series: Optional[Path] = SeriesOpt, json_: bool = JsonOpt) -> None:
    """List the series: each patch, its sha256 and the files it touches."""
    env = env_of(ctx)
    ser = load_series(_series_dir(series) or default_series_dir())
    if json_:
        env.out_result(
            {
                "series": ser.name,
                "series_id": ser.series_id,
                "patches": [
                    {"name": p.name, "sha256": p.sha256, "files": [{"path": f.path, "action": f.action} for f in p.files]}
                    for p in ser.patches
                ],
            },
            message=f"{ser.series_id}: {len(ser.patches)} patch(es)",
        )
        return
    env.err.print(f"{ser.series_id}: {len(ser.patches)} patch(es); one line per patch and file: PATCH ACTION PATH")
    for p in ser.patches:  # data on stdout, tab-separated (grep/cut friendly)
        for f in p.files:
            env.out_line(f"{p.name}\t{f.action}\t{f.path}")


def register(app: typer.Typer) -> None:
    app.add_typer(snapshot_app, name="snapshot")
    app.command("check", cls=Command, epilog="Example: ddtree-deploy check --json")(check_cmd)
    app.command("build", cls=Command, epilog="Example: ddtree-deploy build --out build/sglang-0.5.23")(build_cmd)
    app.add_typer(patches_app, name="patches")
