"""Where things live: the repo's series and pins, and the cache outside the repo.

The cache (downloaded wheels, unpacked snapshots, overlay builds) is
``$DDTREE_DEPLOY_CACHE`` if set, else ``$XDG_CACHE_HOME/ddtree-deploy``, else
``~/.cache/ddtree-deploy``. It never lives inside the repository.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

PACKAGE = "sglang"
DEFAULT_VERSION = "0.5.23"


def repo_root() -> Path:
    """The repository this package was installed from (``deploy/ddtree_deploy`` -> repo)."""
    env = os.environ.get("DDTREE_DEPLOY_REPO")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parent.parent.parent


def cache_dir() -> Path:
    env = os.environ.get("DDTREE_DEPLOY_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "ddtree-deploy").resolve()


def default_series_dir(version: str = DEFAULT_VERSION) -> Path:
    return repo_root() / "patches" / f"{PACKAGE}-{version}"


def default_pin_path(version: str = DEFAULT_VERSION) -> Path:
    return repo_root() / "snapshot" / f"{PACKAGE}-{version}.toml"


def publish_once(dest: Path, marker: str, fill: Callable[[Path], str]) -> Path:
    """Make the cache directory ``dest`` once, never half-made, safe against a concurrent maker.

    ``fill(tmp)`` populates a temp sibling of ``dest`` and returns the text of ``tmp / marker``;
    the temp dir is then renamed to ``dest``. If ``dest / marker`` already exists, nothing runs.
    Losing the rename race to another process that published ``dest`` is fine.
    """
    if (dest / marker).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    try:
        (tmp / marker).write_text(fill(tmp))
        try:
            os.replace(tmp, dest)
        except OSError:
            if not (dest / marker).is_file():  # nobody else won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest
