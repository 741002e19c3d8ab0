"""Fixtures and helpers for the remote-deploy tests (imported by the test modules; not a conftest.py,
so that ``from conftest import ...`` elsewhere in tests/ keeps meaning tests/conftest.py).

Fixtures for the remote-deploy tests: real OpenSSH servers on loopback, one per fake host.

Each fake host: its own 127.0.0.x address and sshd, generated ed25519 keys, a venv whose
site-packages holds a copy of the pinned SGLang files (the ``srt/speculative`` subset of the pinned
wheel for the fast tests; the whole package for the end-to-end test), a known_hosts file that
trusts it, and a table in a temp inventory. Nothing here mocks SSH.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.testing_sshd import FakeHost, sshd_available, unpack_wheel, write_inventory

SUBSET_PREFIX = "sglang/srt/speculative/"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
REPO = Path(__file__).resolve().parents[2]


SSHD_MISSING = sshd_available()
needs_sshd = [pytest.mark.sshd, pytest.mark.skipif(SSHD_MISSING is not None, reason=str(SSHD_MISSING))]


def _wheel() -> Path:
    env = os.environ.get("DDTREE_DEPLOY_TEST_WHEEL")
    if env:
        return Path(env)
    from ddtree_deploy.pin import snapshot

    return snapshot.wheel_path()


@pytest.fixture(scope="session")
def wheel() -> Path:
    try:
        return _wheel()
    except Exception as exc:  # no network and no cache
        pytest.skip(f"pinned wheel unavailable: {exc}")


@pytest.fixture(scope="session")
def light_site(tmp_path_factory, wheel) -> Path:
    """The pinned wheel's srt/speculative/*.py + dist-info (no sglang/__init__.py: a namespace package)."""
    import zipfile

    d = tmp_path_factory.mktemp("light-site")
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if n.startswith(SUBSET_PREFIX) and n.count("/") == 3 and n.endswith(".py")]
    unpack_wheel(wheel, d, members)
    keep_record_rows_of(d, set(members))
    vary_modes_and_mtimes(d)
    return d


def keep_record_rows_of(site: Path, members: set[str]) -> None:
    """The dist-info's RECORD lists only the files this subset installs (as pip would have written
    it for them): ``status``'s RECORD check then sees an intact install, not 6,000 missing files."""
    (record,) = site.glob("sglang-*.dist-info/RECORD")
    info = record.parent.name + "/"
    rows = [ln for ln in record.read_text().splitlines() if ln.split(",", 1)[0] in members or ln.startswith(info)]
    record.write_text("\n".join(rows) + "\n")


# Varied modes and mtimes in the fake hosts' site-packages, so that "restored byte-exactly" is a real
# claim about mode and mtime too (a wheel unpacks every file 0644 with one timestamp).
VARIED_MODES = {SPEC_INFO: 0o640, "sglang/srt/speculative/dflash_info.py": 0o755, "sglang/srt/speculative/eagle_utils.py": 0o600}


def vary_modes_and_mtimes(site: Path) -> None:
    spec = site / "sglang" / "srt" / "speculative"
    for i, p in enumerate(sorted(spec.glob("*.py"))):
        rel = str(p.relative_to(site))
        os.chmod(p, VARIED_MODES.get(rel, 0o644))
        t = 1_600_000_000_000_000_000 + i * 86_400_123_456_789  # distinct, with nanoseconds
        os.utime(p, ns=(t, t))
    os.chmod(spec, 0o750)


def tree_hashes(root: Path) -> dict[str, tuple]:
    """relpath -> ("file", sha256, mode, mtime_ns) for every file and ("dir", mode) for every directory
    under root, ignoring __pycache__. Directory mtimes are left out: any rename inside a directory
    changes its mtime, and nothing (ours or pip's) promises to keep it."""
    out: dict[str, tuple] = {}
    for p in sorted(root.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        st = p.lstat()
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            out[rel] = ("dir", st.st_mode & 0o7777)
        else:
            out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode & 0o7777, st.st_mtime_ns)
    return out


def make_build(
    out: Path,
    base_site: Path,
    changes: dict[str, bytes | None],
    series_id: str = "test+0001",
    modes: dict[str, str] | None = None,
) -> Path:
    """A build dir in the contract's format: ``changes`` maps path -> new bytes (None = delete)."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for path, data in changes.items():
        base = base_site / path
        pristine = hashlib.sha256(base.read_bytes()).hexdigest() if base.exists() else None
        action = "delete" if data is None else ("modify" if pristine else "create")
        if data is not None:
            (out / path).parent.mkdir(parents=True, exist_ok=True)
            (out / path).write_bytes(data)
        files.append(
            {
                "path": path,
                "action": action,
                "pristine_sha256": pristine,
                "patched_sha256": hashlib.sha256(data).hexdigest() if data is not None else None,
                "mode": (modes or {}).get(path, "0644"),
                "patches": ["0001-test.patch"],
            }
        )
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "format": 1,
                "package": "sglang",
                "version": "0.5.23",
                "series": "sglang-0.5.23",
                "series_id": series_id,
                "patches": [{"name": "0001-test.patch", "sha256": "0" * 64}],
                "files": files,
            },
            indent=2,
        )
    )
    return out


MARKER = b"\n\ndef ddtree_test_marker():\n    return 'patched by ddtree-deploy tests'\n"


@pytest.fixture(scope="session")
def builds(tmp_path_factory, light_site) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("builds")
    spec = (light_site / SPEC_INFO).read_bytes()
    ok_mod = b"VALUE = 42\n"
    return {
        "good": make_build(
            d / "good",
            light_site,
            {
                SPEC_INFO: spec + MARKER,
                "sglang/srt/speculative/ddtree_smoke_ok.py": ok_mod,
                "sglang/srt/speculative/ddtree_pkg/sub/__init__.py": b"X = 1\n",
            },
            "sglang-0.5.23+good",
            modes={"sglang/srt/speculative/ddtree_smoke_ok.py": "0755"},
        ),
        "good2": make_build(
            d / "good2",
            light_site,
            {
                SPEC_INFO: spec + MARKER + b"\n\ndef second():\n    return 2\n",
                "sglang/srt/speculative/ddtree_smoke_ok.py": ok_mod,
            },
            "sglang-0.5.23+good2",
        ),
        "bad": make_build(
            d / "bad",
            light_site,
            {
                SPEC_INFO: spec + MARKER,
                "sglang/srt/speculative/ddtree_smoke_ok.py": b"raise RuntimeError('ddtree smoke failure on purpose')\n",
            },
            "sglang-0.5.23+bad",
        ),
        "slow": make_build(
            d / "slow",
            light_site,
            {
                SPEC_INFO: spec + MARKER,
                "sglang/srt/speculative/ddtree_smoke_ok.py": b"import time\ntime.sleep(60)\n",
            },
            "sglang-0.5.23+slow",
        ),
        "big": make_build(
            d / "big",
            light_site,
            {
                SPEC_INFO: spec + MARKER,
                "sglang/srt/speculative/dflash_info.py": (light_site / "sglang/srt/speculative/dflash_info.py").read_bytes()
                + MARKER,
                "sglang/srt/speculative/ddtree_smoke_ok.py": ok_mod,
                "sglang/srt/speculative/ddtree_big_blob.py": b"BLOB = " + repr("x" * (3 << 20)).encode() + b"\n",
            },
            "sglang-0.5.23+big",
        ),
    }


SMOKE_LIGHT = ["sglang.srt.speculative.ddtree_smoke_ok"]


@dataclass
class Fleet:
    root: Path
    hosts: list[FakeHost]
    inventory: Path
    overrides: dict[str, dict[str, Any]]

    def host(self, name: str) -> FakeHost:
        return next(h for h in self.hosts if h.name == name)

    def rewrite_inventory(self) -> None:
        write_inventory(self.inventory, {h.name: h.inventory_table(**self.overrides.get(h.name, {})) for h in self.hosts})

    def stop(self) -> None:
        for h in self.hosts:
            h.stop()


def start_fleet(
    root: Path,
    n: int,
    base_site: Path,
    *,
    names: list[str] | None = None,
    smoke=SMOKE_LIGHT,
    extra_site: list[str] | None = None,
    root_names: list[str] | None = None,
) -> Fleet:
    hosts = []
    overrides: dict[str, dict[str, Any]] = {}
    for i in range(n):
        name = (names or [f"fake{i}" for i in range(n)])[i]
        data_root = root / root_names[i] if root_names else None
        h = FakeHost.create(root / name, i, name, extra_site=extra_site, data_root=data_root)
        shutil.copytree(base_site, h.site, dirs_exist_ok=True, symlinks=True)
        h.start()
        h.trust()
        hosts.append(h)
        overrides[name] = {"site_packages": str(h.site), "smoke_modules": smoke, "smoke_timeout": 60}
    f = Fleet(root, hosts, root / "hosts.toml", overrides)
    f.rewrite_inventory()
    return f


@pytest.fixture
def fleet(tmp_path, light_site):
    f = start_fleet(tmp_path, 2, light_site)
    yield f
    f.stop()


def run_in_process(*args: str, **env_kw: Any) -> tuple[int, str, str]:
    """Run the CLI in-process on an Environment of StringIO streams: (exit code, stdout, stderr)."""
    import io

    from ddtree_deploy.cli import main
    from ddtree_deploy.cli.console import Environment

    env = Environment(stdin=io.StringIO(), stdout=io.StringIO(), stderr=io.StringIO(), **env_kw)
    code = main([str(a) for a in args], env=env)
    return code, env.stdout.getvalue(), env.stderr.getvalue()  # type: ignore[attr-defined]


@pytest.fixture
def cli():
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""
    return run_in_process


def cli_subprocess(args: list[str], env_extra: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "deploy") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, "-m", "ddtree_deploy", *[str(a) for a in args]],  # the console script's entry
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )
