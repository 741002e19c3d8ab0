"""Apply the series to the pinned snapshot and write the patched files plus ``manifest.json``.

This is the one place that turns (series, base tree, pin) into files on disk. ``check`` runs
the same steps without writing (see :func:`check`).
"""

from __future__ import annotations

import os
import py_compile
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ddtree_deploy.build.manifest import MANIFEST_NAME, FileEntry, Manifest, PatchEntry
from ddtree_deploy.errors import CompileError, DDTreeDeployError, HashMismatchError, PinError, UsageError
from ddtree_deploy.hashing import sha256_bytes
from ddtree_deploy.patches.engine import ApplyResult, BaseReader, FileResult, apply_series, compile_check, tree_mode, tree_reader
from ddtree_deploy.patches.series import Series, load_series
from ddtree_deploy.paths import default_pin_path, default_series_dir
from ddtree_deploy.pin.pin import ABSENT, Pin, load_pin


@dataclass
class Inputs:
    series: Series
    base_dir: Path | None  # dir containing sglang/; None when the series only creates files
    pin: Pin | None


def resolve_inputs(
    series_dir: Path | None = None, base_dir: Path | None = None, pin: Pin | None | bool = True, *, fetch: bool = True
) -> Inputs:
    """Load the series and find the base tree. ``pin=True`` loads the repo's pin; ``False``: none."""
    series = load_series(Path(series_dir) if series_dir else default_series_dir())
    if pin is True:
        pin = load_pin(default_pin_path())
    elif pin is False:
        pin = None
    if base_dir is None and _needs_base(series):
        from ddtree_deploy.pin import snapshot

        base_dir = snapshot.ensure_snapshot(pin) if fetch else snapshot.find_snapshot(pin).root
    return Inputs(series, Path(base_dir) if base_dir else None, pin)


def _needs_base(series: Series) -> bool:
    return any(f.action != "create" for p in series.patches for f in p.files)


def _reader(base_dir: Path | None) -> tuple[BaseReader, Callable[[str], int | None]]:
    if base_dir is None:
        return (lambda rel: None), (lambda rel: None)
    return tree_reader(base_dir), tree_mode(base_dir)


def check_pin_coverage(series: Series, pin: Pin) -> None:
    """Policy: a series is built against a pin that records every file it touches (whatever directory
    the series lives in). Only a caller that says so explicitly (``require_coverage=False``: the test
    overlay) may build with a pin that lags the series; the base is still checked against the pin for
    every file the pin does record."""
    missing = [p for p in series.touched_paths() if p not in pin.files]
    if missing:
        raise PinError(
            f"the pin {pin.path} does not record {len(missing)} file(s) the series touches: {', '.join(missing)}",
            hint=(
                f"ddtree-deploy snapshot pin --series {series.directory}"
                + ("" if pin.path is None else f" --pin {pin.path}")
                + "   # records their pristine hashes from the verified snapshot"
            ),
        )


def verify_base_against_pin(result: ApplyResult, pin: Pin) -> None:
    """Every file the series touched must hold exactly the pin's pristine content in the base."""
    for fr in result.files.values():
        want = pin.files.get(fr.path)
        have = ABSENT if fr.base is None else sha256_bytes(fr.base)
        if want is not None and want != have:
            raise HashMismatchError(
                fr.path,
                want,
                have,
                hint="the base tree drifted from the pin: ddtree-deploy snapshot verify (or fetch it again)",
            )


def apply_checked(inputs: Inputs, *, require_coverage: bool = True) -> ApplyResult:
    """Apply + verify + compile, in memory. Raises the first error.

    ``require_coverage=False`` (the overlay used by tests and tools) still refuses a base that
    differs from what the pin records, but tolerates files the pin does not list yet.
    """
    if inputs.pin is not None and require_coverage:
        check_pin_coverage(inputs.series, inputs.pin)
    read, mode = _reader(inputs.base_dir)
    result = apply_series(inputs.series, read, mode)
    if inputs.pin is not None:
        verify_base_against_pin(result, inputs.pin)
    compile_check(result)
    return result


def manifest_for(result: ApplyResult, pin: Pin | None) -> Manifest:
    series = result.series
    package, _, version = series.name.partition("-")
    if pin is not None:
        package, version = pin.name, pin.version
    files = []
    for fr in sorted(result.changed(), key=lambda f: f.path):
        files.append(
            FileEntry(
                path=fr.path,
                action=fr.action,
                pristine_sha256=None if fr.base is None else sha256_bytes(fr.base),
                patched_sha256=None if fr.result is None else sha256_bytes(fr.result),
                mode=f"{fr.mode:04o}",
                patches=list(fr.patches),
            )
        )
    return Manifest(
        package=package,
        version=version,
        series=series.name,
        series_id=series.series_id,
        patches=[PatchEntry(p.name, p.sha256) for p in series.patches],
        files=files,
    )


# What ``build --out DIR`` finds at DIR, and whether it may replace it.
OUT_NEW = "new"  # nothing there: created
OUT_EMPTY = "empty"  # an empty directory: nothing is lost by replacing it
OUT_BUILD = "previous-build"  # a directory holding a previous build (its manifest.json): replaced
OUT_FORCED = "forced"  # anything else, replaced because of --force


def out_dir_action(out_dir: Path, *, force: bool = False) -> str:
    """What writing a build to ``out_dir`` does there; refuses (``UsageError``, exit 2) to replace
    anything but a previous build or an empty directory unless ``force``, and never replaces the
    current directory, one of its parents, or ``/`` (not even with ``force``)."""
    out_dir = Path(out_dir).absolute()
    resolved = out_dir.resolve()
    blocker = next((a for a in out_dir.parents if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise UsageError(
            f"cannot write the build output {out_dir}: {blocker} is a file, not a directory",
            hint="choose a writable --out directory",
            details={"out": str(out_dir)},
        )
    if not os.path.lexists(out_dir):
        return OUT_NEW
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents or resolved == Path(resolved.anchor):
        raise UsageError(
            f"--out {out_dir}: refusing to replace the current directory or one of its parents",
            hint="name a new directory for the build, e.g. --out build/sglang-0.5.23",
            details={"out": str(out_dir)},
        )
    if out_dir.is_dir() and not out_dir.is_symlink():
        if (out_dir / MANIFEST_NAME).is_file():
            try:
                Manifest.load(out_dir / MANIFEST_NAME)
                return OUT_BUILD
            except DDTreeDeployError:
                pass
        elif not any(out_dir.iterdir()):
            return OUT_EMPTY
    if force:
        return OUT_FORCED
    what = "a directory that holds no previous build (no valid manifest.json)"
    if out_dir.is_symlink():
        what = "a symbolic link"
    elif not out_dir.is_dir():
        what = "a file"
    raise UsageError(
        f"--out {out_dir} is {what}; build replaces only a previous build's directory, so nothing there is touched",
        hint=f"choose a new or empty directory (e.g. --out build/sglang-0.5.23), or add --force to replace {out_dir} whole",
        details={"out": str(out_dir), "found": what},
    )


def write_tree(
    result: ApplyResult,
    manifest: Manifest,
    out_dir: Path,
    *,
    force: bool = False,
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """Write the patched files + manifest into ``out_dir``, replacing it whole (never half-written).

    ``out_dir`` may be new, empty, or a previous build; anything else is refused unless ``force``
    (:func:`out_dir_action`). ``finish(tmp)`` adds to the new tree before it is put in place
    (``build --wheel`` writes the wheel there)."""
    action = out_dir_action(out_dir, force=force)
    out_dir = Path(out_dir).absolute()
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    except OSError as exc:
        raise UsageError(
            f"cannot write the build output {out_dir}: {exc.strerror or exc}",
            hint="choose a writable --out directory",
            details={"out": str(out_dir)},
        ) from None
    try:
        for fr in result.changed():
            if fr.result is None:
                continue
            dest = tmp / fr.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(fr.result)
            os.chmod(dest, fr.mode)
            if dest.suffix == ".py":
                _py_compile(dest, fr)
        manifest.save(tmp)
        if finish is not None:
            finish(tmp)
        if action in (OUT_BUILD, OUT_EMPTY, OUT_FORCED):
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _py_compile(path: Path, fr: FileResult) -> None:
    with tempfile.TemporaryDirectory() as cdir:
        try:
            py_compile.compile(str(path), cfile=os.path.join(cdir, "x.pyc"), dfile=fr.path, doraise=True)
        except py_compile.PyCompileError as exc:
            culprit = fr.patches[-1] if fr.patches else "?"
            raise CompileError(f"{fr.path}: py_compile failed: {exc.msg} (last patched by {culprit})") from None


def build(
    out_dir: Path,
    series_dir: Path | None = None,
    base_dir: Path | None = None,
    pin: Pin | None | bool = True,
    *,
    require_coverage: bool = True,
    force: bool = False,
    dry_run: bool = False,
    wheel: Path | None = None,
) -> Manifest:
    """Build the series into ``out_dir``; see the module docstring. Returns the manifest.

    ``out_dir`` is checked first (:func:`out_dir_action`: only a new or empty directory or a previous
    build is replaced, unless ``force``). ``dry_run`` applies and compiles in memory and writes
    nothing. ``wheel`` (the pinned wheel file) also writes the locally versioned wheel and its
    hash-pinned ``requirements.txt`` into ``out_dir`` (``build/wheel.py``)."""
    out_dir_action(out_dir, force=force)
    inputs = resolve_inputs(series_dir, base_dir, pin)
    result = apply_checked(inputs, require_coverage=require_coverage)
    manifest = manifest_for(result, inputs.pin)
    if dry_run:
        return manifest
    finish = None
    if wheel is not None:
        from ddtree_deploy.build.wheel import make_wheel

        pinned = Path(wheel)

        def finish(tmp: Path) -> None:
            make_wheel(tmp, pinned, tmp)

    write_tree(result, manifest, out_dir, force=force, finish=finish)
    return manifest


@dataclass
class PatchReport:
    name: str
    sha256: str
    status: str  # applied | failed | not-reached
    files: list[str]
    error: dict[str, Any] | None = None


@dataclass
class CheckReport:
    ok: bool
    series: str
    series_id: str
    base: str | None
    patches: list[PatchReport] = field(default_factory=list)
    compiled: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    exit_code: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "series": self.series,
            "series_id": self.series_id,
            "base": self.base,
            "patches": [p.__dict__ for p in self.patches],
            "compiled": self.compiled,
            "unlisted": self.unlisted,
            "error": self.error,
            "exit_code": self.exit_code,
        }


def check(inputs: Inputs) -> CheckReport:
    """Apply + verify + compile without writing; a report instead of an exception for patch errors."""
    s = inputs.series
    rep = CheckReport(
        ok=True,
        series=s.name,
        series_id=s.series_id,
        base=str(inputs.base_dir) if inputs.base_dir else None,
        unlisted=list(s.unlisted),
    )
    for p in s.patches:
        rep.patches.append(PatchReport(p.name, p.sha256, "applied", [f.path for f in p.files]))
    try:
        result = apply_checked(inputs)
        rep.compiled = sorted(f.path for f in result.files.values() if f.result is not None and f.path.endswith(".py"))
    except DDTreeDeployError as exc:
        rep.ok = False
        rep.error = exc.to_json()
        rep.exit_code = exc.exit_code
        failed = exc.details.get("patch")
        if isinstance(exc, CompileError):
            for pr in rep.patches:
                if pr.name == failed:
                    pr.status, pr.error = "compile-error", exc.to_json()
        elif failed is not None:
            state = "applied"
            for pr in rep.patches:
                if pr.name == failed:
                    pr.status, pr.error, state = "failed", exc.to_json(), "not-reached"
                elif state == "not-reached":
                    pr.status = "not-reached"
        else:
            for pr in rep.patches:
                pr.status = "not-reached"
    return rep
