"""Where things live: the repo's series and pins, and the cache outside the repo.

The cache (downloaded wheels, unpacked snapshots, overlay builds) is
``$DDTREE_DEPLOY_CACHE`` if set, else ``$XDG_CACHE_HOME/ddtree-deploy``, else
``~/.cache/ddtree-deploy``. It never lives inside the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

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
