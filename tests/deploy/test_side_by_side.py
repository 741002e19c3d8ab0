"""The side-by-side rollout (issue 23 item 1) over real SSH: DDTree in a venv beside a production
environment that holds the real pinned SGLang, production proven untouched byte for byte.

The fake production host is a venv whose site-packages holds the whole pinned sglang (the verified
snapshot plus the wheel's dist-info, so its RECORD is the real one) and, through a .pth, this test
interpreter's packages (pip among them) as its "other packages". The side-by-side host sits beside
it (same sshd, its own venv path, its own state dir) and starts a stand-in HTTP server (NOT SGLang:
it reports the sglang version its interpreter imports) on its own port as its "server".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest
from deploy_fixtures import cli, needs_sshd, tree_hashes, wheel  # noqa: F401

from ddtree_deploy.testing_sshd import FakeHost, standin_server, unpack_wheel, write_inventory

pytestmark = needs_sshd


def sha(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def repo_build(tmp_path_factory):
    """``ddtree-deploy build --wheel`` of the repo's series (the real CLI, the real pinned wheel)."""
    from ddtree_deploy.cli import main

    out = tmp_path_factory.mktemp("build") / "sglang-0.5.23"
    assert main(["build", "--wheel", "--out", str(out), "-q"]) == 0
    return out


@pytest.fixture(scope="module")
def prod(tmp_path_factory, wheel, snapshot_root):  # noqa: F811
    """A fake production host: the whole pinned sglang installed in its venv, its sshd trusted."""
    root = tmp_path_factory.mktemp("prod")
    h = FakeHost.create(root / "ct", 60, "ct", extra_site=[sysconfig.get_paths()["purelib"]])
    shutil.copytree(snapshot_root / "sglang", h.site / "sglang", symlinks=True)
    unpack_wheel(wheel, h.site, [])  # the dist-info, RECORD included
    h.start()
    h.trust()
    yield h
    h.stop()


@pytest.fixture
def inv(prod, tmp_path):
    """An inventory with the production host and its side-by-side host (own venv, port, state dir)."""
    srv = standin_server(tmp_path / "srv")
    venv = tmp_path / "sbs" / "venv"
    prod_table = prod.inventory_table(site_packages=str(prod.site), health_url="http://127.0.0.1:9/health")
    sbs = {
        "side_by_side_of": "ct",
        "venv": str(venv),
        "state_dir": str(tmp_path / "sbs-state"),
        "restart_command": srv.restart_command(str(venv / "bin" / "python"), lifetime=300),
        "stop_command": srv.stop_command(),
        "health_url": srv.health_url(),
        "health_timeout": 30,
        "smoke_modules": [],
        "smoke_run": [],
        "smoke_timeout": 120,
    }
    path = write_inventory(tmp_path / "hosts.toml", {"ct": prod_table, "ct-ddtree": sbs})
    yield path, venv, srv, tmp_path / "sbs-state"
    srv.kill()


def prod_bytes(prod: FakeHost) -> dict:
    """Every file of the production venv (its site-packages included): content, mode, mtime."""
    return tree_hashes(prod.venv)


def venv_run(venv: Path, code: str) -> str:
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def audit(state: Path) -> list[dict]:
    p = state / "audit.log"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_side_by_side_rollout_end_to_end_production_untouched(prod, inv, repo_build, cli):  # noqa: F811
    path, venv, srv, state = inv
    manifest = json.loads((repo_build / "manifest.json").read_text())
    local = "0.5.23+ddtree." + manifest["series_id"].split("+", 1)[1]
    before = prod_bytes(prod)

    code, out, err = cli("rollout", "ct-ddtree", "--build", repo_build, "--dry-run", "--inventory", path, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["hosts"][0]["status"] == "would-install" and "wrote nothing" in doc["message"]
    assert not venv.exists() and not state.exists()

    code, out, err = cli("rollout", "ct-ddtree", "--build", repo_build, "--why", "try ddtree", "--inventory", path, "--json")
    assert code == 0, out + err
    r = json.loads(out)["hosts"][0]
    assert r["status"] == "rolled-out" and "untouched" in r["message"] and "healthy" in r["message"]

    # smoke of the side-by-side host checks what is installed there (issue 40 item 2): every .py file
    # the series patches, compiled in the venv, with no --build; an in-place host with nothing
    # deployed and no --build has nothing to check: a failure (exit 12), never "ok"
    from ddtree_deploy.patches.series import load_series
    from ddtree_deploy.paths import default_series_dir

    n_py = len([p for p in load_series(default_series_dir()).touched_paths() if p.endswith(".py")])
    code, out, err = cli("smoke", "ct-ddtree", "--inventory", path, "--json")
    assert code == 0, out + err
    assert f"compiled {n_py} file(s)" in json.loads(out)["hosts"][0]["message"], out
    code, out, err = cli("smoke", "ct", "--inventory", path, "--json")
    assert code == 12 and "nothing to smoke-test" in json.loads(out)["message"], out + err

    # the venv: pip installed the DDTree wheel there; its interpreter imports it from there
    assert venv_run(venv, "import importlib.metadata as m; print(m.version('sglang'))") == local
    site = Path(venv_run(venv, "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    origin = venv_run(venv, "import importlib.util as u; print(u.find_spec('sglang').submodule_search_locations[0])")
    assert Path(origin) == site / "sglang"
    for f in manifest["files"]:
        target = site / f["path"]
        assert (sha(target) if target.exists() else None) == f["patched_sha256"], f["path"]
    # its server runs on its own port, in the venv, and sees the DDTree build
    info = get_json(srv.health_url())
    assert info["sglang_version"] == local and info["python"] == str(venv / "bin" / "python")

    # production: byte for byte what it was (content, mode, mtime of every file of its venv)
    assert prod_bytes(prod) == before
    code, out, err = cli("status", "ct", "--inventory", path, "--json", "--strict")
    assert code == 0, err
    st = json.loads(out)["hosts"][0]
    assert st["data"]["record"]["intact"] and st["data"]["record"]["files"] > 4000
    assert "RECORD: all" in st["message"] and "untouched" in st["message"]
    # status of the side-by-side target: the build's files patched, the venv's own RECORD intact
    code, out, err = cli("status", "ct-ddtree", "--build", repo_build, "--inventory", path, "--json")
    assert code == 0, err
    st = json.loads(out)["hosts"][0]["data"]
    assert {f["state"] for f in st["files"]} == {"patched"} and st["record"]["intact"]
    assert st["record"]["version"] == local
    code, out, err = cli("smoke", "ct-ddtree", "--build", repo_build, "--inventory", path, "--json")
    assert code == 0, err  # smoke runs in the venv (its interpreter imports its own sglang)
    assert json.loads(out)["hosts"][0]["data"]["import_check"]["found"] == [str(site / "sglang")]
    ops = [(e["op"], e.get("result")) for e in audit(state)]
    assert ("rollout", "installed") in ops and ("restart", "healthy") in ops

    # "rollback" of the side-by-side target is reinstalling the pin there
    code, out, err = cli("rollout", "ct-ddtree", "--pristine", "--inventory", path, "--json")
    assert code == 0, out + err
    assert venv_run(venv, "import importlib.metadata as m; print(m.version('sglang'))") == "0.5.23"
    assert get_json(srv.health_url())["sglang_version"] == "0.5.23"

    # --remove stops its server and deletes the venv; production still untouched
    code, out, err = cli("rollout", "ct-ddtree", "--remove", "--inventory", path, "--json")
    assert code == 0, out + err
    assert not venv.exists()
    with pytest.raises(OSError):
        get_json(srv.health_url())
    assert prod_bytes(prod) == before


def test_push_and_rollback_refuse_a_side_by_side_host(prod, inv, cli, tmp_path):  # noqa: F811
    path, venv, _, state = inv
    for argv in (["push", "ct-ddtree", "--build", tmp_path], ["rollback", "ct-ddtree"]):
        code, out, err = cli(*argv, "--inventory", path)
        assert code == 2 and "side-by-side host" in err and "fix: ddtree-deploy rollout ct-ddtree" in err, err
    assert not venv.exists() and not state.exists()


def test_push_refuses_a_host_that_serves_traffic_and_all_leaves_it_out(prod, inv, repo_build, cli, tmp_path):  # noqa: F811
    """Issue 40 item 1: the inventory knows ct serves traffic (ct-ddtree sits beside it), so `push ct`
    is refused before anything touches the host (exit 2, the fix names the rollout), `push --all`
    leaves it out, and only an explicit `allow_in_place = true` in its entry lets a push through."""
    path, venv, _, state = inv
    before = prod_bytes(prod)
    for argv in (["push", "ct"], ["push", "ct", "--dry-run"]):
        code, out, err = cli(*argv, "--build", repo_build, "--inventory", path)
        assert code == 2, (argv, out, err)
        assert "ct serves traffic" in err and "ct-ddtree sits beside it" in err, err
        assert "allow_in_place = true" in err and "fix: ddtree-deploy rollout ct-ddtree" in err, err
    code, out, err = cli("push", "--all", "--build", repo_build, "--inventory", path, "--json")
    assert code == 2 and "leaves out ct" in err and "no host to patch in place" in err, (out, err)
    assert prod_bytes(prod) == before
    assert not Path(os.path.expanduser(str(prod.state_dir))).joinpath("audit.log").exists()

    # serving = true marks production without a side-by-side entry
    prod_table = prod.inventory_table(site_packages=str(prod.site), health_url="http://127.0.0.1:9/health")
    marked = write_inventory(tmp_path / "marked.toml", {"ct": dict(prod_table, serving=True)})
    code, out, err = cli("push", "ct", "--build", repo_build, "--inventory", marked)
    assert code == 2 and "serving = true" in err and "fix: ddtree-deploy rollout ct-ddtree" in err, err
    # serving = false cannot contradict a side-by-side entry; bad values are refused where they enter
    for bad, want in (
        ({"serving": False}, "serving = false, but sbs sits beside it"),
        ({"allow_in_place": "yes"}, "'allow_in_place' must be true or false"),
    ):
        p = write_inventory(
            tmp_path / "bad.toml",
            {
                "ct": dict(prod_table, **bad),
                "sbs": {"side_by_side_of": "ct", "venv": str(tmp_path / "v"), "health_url": "http://127.0.0.1:30100/health"},
            },
        )
        code, out, err = cli("status", "ct", "--inventory", p)
        assert code == 2 and want in err and "fix:" in err, (bad, err)
    assert prod_bytes(prod) == before

    # the explicit opt-in: the same host, allow_in_place = true, is pushed (a dry run: nothing written)
    opted = write_inventory(tmp_path / "opted.toml", {"ct": dict(prod_table, serving=True, allow_in_place=True)})
    code, out, err = cli("push", "ct", "--dry-run", "--build", repo_build, "--inventory", opted, "--json")
    assert code == 0, out + err
    assert json.loads(out)["hosts"][0]["host"] == "ct"
    assert prod_bytes(prod) == before


def test_rollout_refuses_a_venv_it_did_not_make(prod, inv, repo_build, cli):  # noqa: F811
    path, venv, _, state = inv
    venv.mkdir(parents=True)
    (venv / "precious.txt").write_text("someone's work\n")
    before = tree_hashes(venv)
    code, out, err = cli("rollout", "ct-ddtree", "--build", repo_build, "--inventory", path, "--json")
    assert code == 6, err
    assert "not made by ddtree-deploy" in json.loads(out)["message"]
    code, out, err = cli("rollout", "ct-ddtree", "--remove", "--inventory", path)
    assert code == 6
    assert tree_hashes(venv) == before


def test_a_failed_install_removes_the_venv_and_leaves_production_untouched(prod, inv, repo_build, cli, tmp_path):  # noqa: F811
    """The smoke of the venv fails (an inventory smoke module that does not exist): exit 8, venv gone."""
    path, venv, _, state = inv
    text = path.read_text().replace("smoke_modules = []", 'smoke_modules = ["sglang.no_such_module_here"]')
    path.write_text(text)
    before = prod_bytes(prod)
    code, out, err = cli("rollout", "ct-ddtree", "--build", repo_build, "--inventory", path, "--json")
    assert code == 8, out + err
    doc = json.loads(out)
    assert "the side-by-side venv was removed" in doc["message"] and "production untouched" in doc["message"]
    assert not venv.exists()
    assert prod_bytes(prod) == before
    assert audit(state)[-1]["result"].startswith("failed")


def test_a_rollout_that_sees_production_change_under_it_says_so_exit_9(prod, inv, repo_build, cli):  # noqa: F811
    """The agent compares production's RECORD check before and after the install. Here the venv's own
    smoke run edits a production file meanwhile: a module this test puts beside production's sglang
    (not in its RECORD, so the "before" check is still all-match), which the venv finds through its
    layering on production's site-packages."""
    path, venv, _, state = inv
    target = prod.site / "sglang" / "srt" / "speculative" / "spec_info.py"
    toucher = prod.site / "ddtree_test_toucher.py"
    toucher.write_text(f"open({str(target)!r}, 'ab').write(b'# touched during the rollout\\n')\n")
    data, st = target.read_bytes(), target.stat()
    path.write_text(path.read_text().replace("smoke_run = []", 'smoke_run = ["ddtree_test_toucher"]'))
    try:
        code, out, err = cli("rollout", "ct-ddtree", "--build", repo_build, "--no-start", "--inventory", path, "--json")
        assert code == 9, out + err
        doc = json.loads(out)
        assert "production's sglang changed during the rollout" in doc["message"]
        assert doc["hosts"][0]["data"]["record_after"]["mismatched"] == ["sglang/srt/speculative/spec_info.py"]
        assert not venv.exists()  # its own venv removed all the same
    finally:
        target.write_bytes(data)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        toucher.unlink()
        shutil.rmtree(prod.site / "__pycache__", ignore_errors=True)


def test_status_names_production_files_changed_by_hand(prod, inv, cli):  # noqa: F811
    """RECORD is the drift check: a production file edited by hand (not by a deploy) is 'unexplained'."""
    path = inv[0]
    target = prod.site / "sglang" / "srt" / "speculative" / "spec_info.py"
    data = target.read_bytes()
    st = target.stat()
    try:
        target.write_bytes(data + b"# edited by hand\n")
        code, out, err = cli("status", "ct", "--strict", "--inventory", path, "--json")
        assert code == 14, err
        rec = json.loads(out)["hosts"][0]["data"]["record"]
        assert rec["unexplained"] == ["sglang/srt/speculative/spec_info.py"] and not rec["intact"]
    finally:
        target.write_bytes(data)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_inventory_refuses_unsafe_side_by_side_hosts(prod, tmp_path, cli):  # noqa: F811
    prod_table = prod.inventory_table(site_packages=str(prod.site), health_url="http://127.0.0.1:30000/health")
    good = {"side_by_side_of": "ct", "venv": str(tmp_path / "v"), "health_url": "http://127.0.0.1:30100/health"}
    cases = [
        ({"health_url": "http://127.0.0.1:30000/health"}, "production's"),
        ({"venv": str(prod.venv)}, "production's own environment"),
        ({"venv": "relative/venv"}, "needs 'venv'"),
        ({"side_by_side_of": "nope"}, "names no other host"),
        ({"python": "/usr/bin/python3"}, "derived for a side-by-side host"),
        ({"state_dir": str(prod.state_dir)}, "state_dir is production's"),
    ]
    for change, want in cases:
        p = write_inventory(tmp_path / "hosts.toml", {"ct": prod_table, "sbs": {**good, **change}})
        code, out, err = cli("rollout", "sbs", "--dry-run", "--inventory", p)
        assert code == 2 and want in err and "fix:" in err, (change, err)
    p = write_inventory(tmp_path / "hosts.toml", {"ct": prod_table, "sbs": good})
    code, out, err = cli("rollout", "ct", "--dry-run", "--inventory", p)
    assert code == 2 and "not a side-by-side host" in err


def test_side_by_side_server_that_does_not_get_healthy_exits_12_keeps_the_venv(prod, inv, repo_build, cli):  # noqa: F811
    path, venv, srv, state = inv
    nothing = "http://127.0.0.1:19/health"  # a closed loopback port: never healthy
    text = path.read_text().replace(srv.health_url(), nothing).replace("health_timeout = 30", "health_timeout = 2")
    path.write_text(text)
    before = prod_bytes(prod)
    t0 = time.monotonic()
    code, out, err = cli("rollout", "ct-ddtree", "--build", repo_build, "--inventory", path, "--json")
    assert code == 12, out + err
    assert "the venv is kept; production untouched" in json.loads(out)["message"]
    assert venv.exists() and time.monotonic() - t0 < 300
    assert [e["result"] for e in audit(state) if e["op"] == "restart"][-1].startswith("health check")
    assert prod_bytes(prod) == before
    assert cli("rollout", "ct-ddtree", "--remove", "--inventory", path)[0] == 0
