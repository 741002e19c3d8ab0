"""The pinned SGLang snapshot: download the wheel, verify it, unpack ``sglang/`` into the cache.

Layout under the cache dir (see :mod:`paths`)::

    wheels/<wheel filename>                       # the downloaded wheel, sha256-verified
    snapshots/sglang-0.5.23/<wheel sha256[:16]>/sglang/...   # the unpacked package
    snapshots/sglang-0.5.23/<wheel sha256[:16]>/.snapshot.json

Nothing here writes into the repository. A snapshot is unpacked into a temp dir and renamed
into place, so a half-unpacked snapshot is never seen.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ddtree_deploy.errors import FetchError, HashMismatchError, SnapshotMissingError
from ddtree_deploy.hashing import sha256_file
from ddtree_deploy.paths import cache_dir, default_pin_path, publish_once
from ddtree_deploy.pin.pin import ABSENT, Pin, WheelPin, load_pin

MARKER = ".snapshot.json"


@dataclass(frozen=True)
class Snapshot:
    """An unpacked, verified pinned package: ``root / "sglang"`` is the package."""

    root: Path
    wheel: WheelPin

    @property
    def package_dir(self) -> Path:
        return self.root / "sglang"


def wheels_dir() -> Path:
    return cache_dir() / "wheels"


def snapshot_root(pin: Pin, wheel: WheelPin) -> Path:
    return cache_dir() / "snapshots" / f"{pin.name}-{pin.version}" / wheel.sha256[:16]


@dataclass(frozen=True)
class DownloadEvent:
    """A download starting or ending, for whoever observes them (the CLI prints a line)."""

    phase: str  # "start" | "done"
    what: str
    detail: str


@dataclass
class _Observer:
    notify: Callable[[DownloadEvent], None]
    progress_fd: Callable[[], int | None] | None


_observers: list[_Observer] = []
_observers_lock = threading.Lock()


@contextmanager
def observe_downloads(
    notify: Callable[[DownloadEvent], None], *, progress_fd: Callable[[], int | None] | None = None
) -> Iterator[None]:
    """While inside, every download of the pinned wheel is announced to ``notify`` (start and end);
    when ``progress_fd()`` gives a descriptor (a terminal's), pip's own progress output goes there.
    The core prints nothing itself."""
    obs = _Observer(notify, progress_fd)
    with _observers_lock:
        _observers.append(obs)
    try:
        yield
    finally:
        with _observers_lock:
            _observers.remove(obs)


def _announce(ev: DownloadEvent) -> int | None:
    with _observers_lock:
        current = _observers[-1] if _observers else None
    if current is None:
        return None
    current.notify(ev)
    return current.progress_fd() if current.progress_fd is not None else None


def _pip_download(pin: Pin, dest: Path, python_version: str | None) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    if python_version:
        cmd += ["--python-version", python_version]
    cmd.append(pin.requirement)
    tag = f"cp{python_version.replace('.', '')}" if python_version else f"cp{sys.version_info.major}{sys.version_info.minor}"
    progress_fd = _announce(
        DownloadEvent("start", f"the pinned {pin.requirement} wheel", f"{tag}, with pip, into {wheels_dir()}")
    )
    if progress_fd is not None:  # a terminal: pip draws its progress bar there (stdout stays data only)
        proc = subprocess.run(cmd + ["--progress-bar", "on"], stdout=progress_fd, stderr=subprocess.PIPE, text=True)
    else:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
        raise FetchError(
            f"pip could not download {pin.requirement}: " + " | ".join(tail),
            hint="check the network, or pass a local wheel: ddtree-deploy snapshot fetch --wheel PATH",
        )
    found = sorted(dest.glob(f"{pin.name}-{pin.version}-*.whl"))
    if len(found) != 1:
        raise FetchError(f"expected one {pin.name} {pin.version} wheel from pip, found {[p.name for p in found]}")
    _announce(DownloadEvent("done", found[0].name, f"{found[0].stat().st_size / 1e6:.1f} MB"))
    return found[0]


def verify_wheel(pin: Pin, wheel_file: Path) -> WheelPin:
    wp = pin.wheel_named(wheel_file.name)
    if wp is None:
        known = ", ".join(w.filename for w in pin.wheels)
        raise FetchError(
            f"{wheel_file.name} is not a wheel the pin verified (pinned: {known})",
            hint="add its [[wheel]] entry to the pin only after checking it matches the pinned files",
        )
    actual = sha256_file(wheel_file)
    if actual != wp.sha256:
        raise HashMismatchError(wheel_file.name, wp.sha256, actual)
    return wp


def fetch(pin: Pin | None = None, *, wheel: Path | None = None, python_version: str | None = None) -> Snapshot:
    """Download (or take ``wheel``), verify against the pin, unpack into the cache. Idempotent."""
    pin = pin or load_pin(default_pin_path())
    wheels_dir().mkdir(parents=True, exist_ok=True)
    if wheel is None:
        pinned = [wheels_dir() / w.filename for w in pin.wheels]
        wanted_tag = _wanted_tag(python_version)
        hit = [p for p in pinned if p.is_file() and WheelPin(p.name, "").python_tag == wanted_tag]
        if hit:
            wheel = hit[0]
        else:
            with tempfile.TemporaryDirectory(dir=wheels_dir()) as tmp:
                got = _pip_download(pin, Path(tmp), python_version)
                verify_wheel(pin, got)
                final = wheels_dir() / got.name
                os.replace(got, final)
                wheel = final
    wp = verify_wheel(pin, wheel)
    cached = wheels_dir() / wp.filename
    if Path(wheel).resolve() != cached.resolve():
        tmp_copy = cached.with_name(cached.name + f".tmp-{os.getpid()}")
        shutil.copyfile(wheel, tmp_copy)
        os.replace(tmp_copy, cached)
    root = snapshot_root(pin, wp)

    def unpack(tmp_root: Path) -> str:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                name = info.filename
                if not name.startswith(f"{pin.name}/") or name.endswith("/"):
                    continue
                if name.startswith("/") or ".." in Path(name).parts:
                    raise FetchError(f"{wheel.name}: refusing unsafe member {name!r}")
                zf.extract(info, tmp_root)
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    os.chmod(tmp_root / name, mode)
        return json.dumps({"wheel": wp.filename, "sha256": wp.sha256}) + "\n"

    publish_once(root, MARKER, unpack)
    return Snapshot(root, wp)


def _wanted_tag(python_version: str | None) -> str:
    if python_version is None:
        return f"cp{sys.version_info.major}{sys.version_info.minor}"
    return "cp" + "".join(python_version.split(".")[:2])


def fetch_plan(pin: Pin, *, wheel: Path | None = None, python_version: str | None = None) -> dict[str, str]:
    """What :func:`fetch` would do, without doing it (``snapshot fetch --dry-run``)."""
    tag = _wanted_tag(python_version)
    if wheel is not None:
        return {"action": "would verify and unpack the local wheel", "wheel": str(wheel), "cache": str(cache_dir())}
    hit = [w for w in pin.wheels if w.python_tag == tag and (wheels_dir() / w.filename).is_file()]
    if hit:
        return {"action": "would re-verify the cached", "wheel": hit[0].filename, "cache": str(cache_dir())}
    return {"action": f"would download (pip, {tag}) and verify", "wheel": pin.requirement, "cache": str(cache_dir())}


def pinned_wheel_file(pin: Pin, python_version: str | None = None) -> Path:
    """The verified pinned wheel for ``python_version`` (default: this interpreter's), fetched if needed."""
    tag = _wanted_tag(python_version)
    for w in pin.wheels:
        path = wheels_dir() / w.filename
        if w.python_tag == tag and path.is_file():
            verify_wheel(pin, path)
            return path
    if not any(w.python_tag == tag for w in pin.wheels):
        known = ", ".join(w.python_tag for w in pin.wheels)
        raise FetchError(
            f"the pin verified no {pin.requirement} wheel for {tag} (pinned: {known})",
            hint="use a Python the pin covers (--python-version), or verify and pin that wheel first",
        )
    s = fetch(pin, python_version=python_version)
    return wheels_dir() / s.wheel.filename


def find_snapshot(pin: Pin | None = None) -> Snapshot:
    """The cached snapshot for this pin (the current Python's wheel first), without downloading."""
    pin = pin or load_pin(default_pin_path())
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    ordered = sorted(pin.wheels, key=lambda w: w.python_tag != tag)
    for wp in ordered:
        root = snapshot_root(pin, wp)
        if (root / MARKER).is_file():
            return Snapshot(root, wp)
    raise SnapshotMissingError(
        f"the pinned {pin.requirement} snapshot is not in the cache ({cache_dir()})",
        hint="ddtree-deploy snapshot fetch",
    )


def ensure_snapshot(pin: Pin | None = None) -> Path:
    """Path of the directory that holds the pinned ``sglang/`` package; fetches it if needed."""
    try:
        return find_snapshot(pin).root
    except SnapshotMissingError:
        return fetch(pin).root


def wheel_path(pin: Pin | None = None) -> Path:
    """The verified pinned wheel file in the cache (fetching it if needed)."""
    snap = find_snapshot(pin) if _has_snapshot(pin) else fetch(pin)
    return wheels_dir() / snap.wheel.filename


def _has_snapshot(pin: Pin | None) -> bool:
    try:
        snap = find_snapshot(pin)
    except SnapshotMissingError:
        return False
    return (wheels_dir() / snap.wheel.filename).is_file()


def verify_tree(pin: Pin, root: Path) -> list[str]:
    """Re-hash every pinned file under ``root`` (a dir containing ``sglang/``).

    Returns the list of verified paths; raises :class:`HashMismatchError` on the first file that
    differs (naming the file and both hashes), or that exists although the pin says absent.
    """
    checked = []
    for rel, digest in sorted(pin.files.items()):
        path = root / rel
        if digest == ABSENT:
            if path.exists():
                raise HashMismatchError(rel, ABSENT, sha256_file(path) if path.is_file() else "a directory")
        else:
            actual = sha256_file(path) if path.is_file() else "missing"
            if actual != digest:
                raise HashMismatchError(
                    rel, digest, actual, hint="ddtree-deploy snapshot fetch   # after removing the cached copy"
                )
        checked.append(rel)
    return checked
