"""End to end on a fake host that holds the WHOLE pinned SGLang, importing under its real deps.

The fake host's interpreter is a venv whose site-packages holds its own copy of the pinned sglang;
SGLang's import dependencies (torch, transformers, ...) come from this test interpreter's
site-packages through a .pth file (see ../shared/notes/sglang-0.5.23.md, "Importing on a machine
without a GPU"). The smoke step imports the patched DFlash modules in a fresh interpreter there.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sysconfig

import pytest
from deploy_fixtures import MARKER, cli, make_build, needs_sshd, start_fleet, tree_hashes, wheel  # noqa: F401

pytestmark = [*needs_sshd, pytest.mark.sglang_deps]

DFLASH = [
    "sglang/srt/speculative/spec_info.py",
    "sglang/srt/speculative/dflash_info.py",
    "sglang/srt/speculative/dflash_worker_v2.py",
]
SMOKE = [
    "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.dflash_info",
    "sglang.srt.speculative.dflash_worker_v2",
    "sglang.srt.speculative.ddtree_e2e_probe",
]


@pytest.fixture(scope="module")
def full_site(tmp_path_factory, wheel, snapshot_root):
    for dep in ("torch", "transformers", "orjson", "pydantic"):
        if importlib.util.find_spec(dep) is None:
            pytest.fail(
                f"SGLang's import dependency {dep} is not installed: pip install -e '.[sglang-deps]' "
                "(make test does); the end-to-end test fails rather than skips"
            )
    from ddtree_deploy.testing_sshd import unpack_wheel

    d = tmp_path_factory.mktemp("full-site")
    shutil.copytree(snapshot_root / "sglang", d / "sglang", symlinks=True)
    unpack_wheel(wheel, d, [])  # just the dist-info (the version the preflight checks)
    return d


def test_push_smoke_rollback_with_real_sglang_imports(tmp_path, full_site, cli):
    f = start_fleet(tmp_path, 1, full_site, smoke=SMOKE, extra_site=[sysconfig.get_paths()["purelib"]])
    try:
        h = f.hosts[0]
        f.overrides["fake0"]["smoke_timeout"] = 240
        f.rewrite_inventory()
        changes = {p: (full_site / p).read_bytes() + MARKER for p in DFLASH}
        changes["sglang/srt/speculative/ddtree_e2e_probe.py"] = (
            b"from sglang.srt.speculative.spec_info import SpeculativeAlgorithm, ddtree_test_marker\n"
            b"from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2\n"
            b"assert SpeculativeAlgorithm.DFLASH.is_dflash_family() "
            b"if hasattr(SpeculativeAlgorithm.DFLASH, 'is_dflash_family') else True\n"
            b"assert ddtree_test_marker().startswith('patched')\n"
        )
        build = make_build(tmp_path / "build", full_site, changes, "sglang-0.5.23+e2e")
        before = tree_hashes(h.site / "sglang" / "srt" / "speculative")
        code, out, err = cli("push", "fake0", "--build", build, "--inventory", f.inventory, "--json")
        assert code == 0, out + err
        r = json.loads(out)["hosts"][0]
        assert r["data"]["checks"]["modules"] == SMOKE and r["data"]["checks"]["ok"]
        code, out, err = cli("smoke", "fake0", "--inventory", f.inventory)
        assert code == 0, err
        code, out, err = cli("rollback", "fake0", "--inventory", f.inventory)
        assert code == 0, err
        assert tree_hashes(h.site / "sglang" / "srt" / "speculative") == before
    finally:
        f.stop()


def test_push_the_repo_series_build(tmp_path, full_site, cli):
    """The real series (whatever `ddtree-deploy build` makes now), default smoke = its patched modules."""
    from ddtree_deploy.build.build import build

    build(tmp_path / "build")  # the repo's series must build: a failure here fails the test (never a skip)
    f = start_fleet(tmp_path / "hosts", 1, full_site, smoke=None, extra_site=[sysconfig.get_paths()["purelib"]])
    try:
        f.overrides["fake0"].pop("smoke_modules", None)
        f.overrides["fake0"]["smoke_timeout"] = 240
        f.rewrite_inventory()
        h = f.hosts[0]
        before = tree_hashes(h.site / "sglang")
        code, out, err = cli("push", "fake0", "--build", tmp_path / "build", "--inventory", f.inventory, "--json")
        assert code == 0, out + err
        code, out, err = cli("rollback", "fake0", "--inventory", f.inventory)
        assert code == 0, err
        assert tree_hashes(h.site / "sglang") == before
    finally:
        f.stop()
