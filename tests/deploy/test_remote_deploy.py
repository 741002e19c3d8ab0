"""Remote deployment over real SSH (issue 3): every test talks to real sshd processes on loopback."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from deploy_fixtures import (  # noqa: F401 (fixtures)
    MARKER,
    SPEC_INFO,
    builds,
    cli,
    cli_subprocess,
    fleet,
    light_site,
    make_build,
    needs_sshd,
    start_fleet,
    tree_hashes,
    wheel,
)

pytestmark = needs_sshd


def records(h) -> list[dict]:
    base = h.state_dir / "deploys"
    if not base.exists():
        return []
    out = []
    for d in sorted(base.iterdir()):
        try:
            out.append(json.loads((d / "record.json").read_text()))
        except (FileNotFoundError, ValueError):  # being written right now
            pass
    return out


def audit(h) -> list[dict]:
    p = h.state_dir / "audit.log"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def manifest_hashes(build: Path) -> dict[str, str | None]:
    m = json.loads((build / "manifest.json").read_text())
    return {f["path"]: f["patched_sha256"] for f in m["files"]}


def host_hashes(h, paths) -> dict[str, str | None]:
    import hashlib

    out = {}
    for p in paths:
        f = h.site / p
        out[p] = hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else None
    return out


def no_temp_files(h) -> bool:
    return not [p for p in h.site.rglob("*ddtree-*.tmp")]


def wait_for(pred, timeout=20.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


# --- the round trip ---------------------------------------------------------------------------------


def test_push_status_smoke_rollback_round_trip(fleet, builds, cli, light_site):
    inv = fleet.inventory
    before = {h.name: tree_hashes(h.site) for h in fleet.hosts}
    code, out, err = cli("push", "--all", "--build", builds["good"], "--inventory", inv, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] and [r["status"] for r in doc["hosts"]] == ["deployed", "deployed"]
    want = manifest_hashes(builds["good"])
    for h in fleet.hosts:
        assert host_hashes(h, want) == want
        assert no_temp_files(h)
        (rec,) = records(h)
        assert rec["status"] == "deployed" and rec["series_id"] == "sglang-0.5.23+good"
        # backups live outside site-packages and verify
        backup = h.state_dir / "deploys" / rec["deploy_id"] / "backup" / SPEC_INFO
        assert backup.read_bytes() == (light_site / SPEC_INFO).read_bytes()
        assert not (h.state_dir / "lock").exists()
        assert [e["result"] for e in audit(h)] == ["deployed"]

    code, out, err = cli("status", "fake0", "--build", builds["good"], "--inventory", inv, "--json")
    assert code == 0, err
    st = json.loads(out)["hosts"][0]["data"]
    assert {f["state"] for f in st["files"]} == {"patched"}
    assert {f["series"] for f in st["files"]} == {"sglang-0.5.23+good"}
    assert st["lock"] is None and st["last_deploy"]["status"] == "deployed"

    code, out, err = cli("smoke", "--all", "--inventory", inv, "--json")
    assert code == 0, err
    assert all(r["data"]["checks"]["ok"] for r in json.loads(out)["hosts"])

    code, out, err = cli("rollback", "--all", "--inventory", inv, "--json")
    assert code == 0, err
    for h in fleet.hosts:
        assert tree_hashes(h.site) == before[h.name]  # byte-exact, modes too, created dirs gone
        assert records(h)[0]["status"] == "undone"
        assert [e["op"] for e in audit(h)] == ["push", "rollback"]

    code, out, err = cli("status", "fake1", "--build", builds["good"], "--inventory", inv, "--json")
    assert {f["state"] for f in json.loads(out)["hosts"][0]["data"]["files"]} == {"pristine"}

    code, out, err = cli("history", "fake1", "--inventory", inv)
    assert code == 0 and "push" in out and "rollback" in out

    code, out, err = cli("rollback", "fake1", "--inventory", inv)
    assert code == 0 and "nothing to roll back" in err


def test_repush_sends_nothing_and_upgrade_and_rollback_to(fleet, builds, cli):
    inv = fleet.inventory
    h = fleet.host("fake0")
    before = tree_hashes(h.site)
    assert cli("push", "fake0", "--build", builds["good"], "--inventory", inv)[0] == 0
    code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", inv, "--json")
    assert code == 0, err
    r = json.loads(out)["hosts"][0]
    assert r["status"] == "unchanged" and r["files_sent"] == 0 and r["bytes_sent"] == 0
    assert "nothing to send" in r["message"]
    assert len(records(h)) == 1
    first = records(h)[0]["deploy_id"]
    # a newer series replaces our own earlier files (recognised from the host's records)
    code, out, err = cli("push", "fake0", "--build", builds["good2"], "--inventory", inv, "--json")
    assert code == 0, err
    assert host_hashes(h, manifest_hashes(builds["good2"])) == manifest_hashes(builds["good2"])
    # --to FIRST undoes everything after FIRST: back to the "good" state
    code, out, err = cli("rollback", "fake0", "--to", first, "--inventory", inv)
    assert code == 0, err
    assert host_hashes(h, manifest_hashes(builds["good"])) == manifest_hashes(builds["good"])
    code, out, err = cli("rollback", "fake0", "--to", "nosuch", "--inventory", inv)
    assert code == 2
    code, out, err = cli("rollback", "fake0", "--to", "pristine", "--inventory", inv)
    assert code == 0, err
    assert tree_hashes(h.site) == before


def test_site_packages_asked_from_the_interpreter(fleet, builds, cli):
    del fleet.overrides["fake1"]["site_packages"]
    fleet.rewrite_inventory()
    h = fleet.host("fake1")
    code, out, err = cli("push", "fake1", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
    assert code == 0, err
    assert host_hashes(h, manifest_hashes(builds["good"])) == manifest_hashes(builds["good"])
    assert records(h)[0]["site_packages"] == str(h.site)


def test_preflight_and_smoke_prove_the_interpreter_imports_the_inventory_site(fleet, builds, cli, light_site, tmp_path):
    """site_packages names a copy of sglang that the host's python does not import: refused, nothing written."""
    import shutil

    other = tmp_path / "other-site"
    shutil.copytree(light_site, other, symlinks=True)
    fleet.overrides["fake0"]["site_packages"] = str(other)
    fleet.rewrite_inventory()
    h = fleet.host("fake0")
    before, before_other = tree_hashes(h.site), tree_hashes(other)
    code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
    r = json.loads(out)["hosts"][0]
    assert code == 6, out + err
    assert f"imports sglang from {(h.site / 'sglang').resolve()}" in r["message"] and str(other) in r["message"]
    assert tree_hashes(h.site) == before and tree_hashes(other) == before_other and not h.state_dir.exists()
    code, out, err = cli("smoke", "fake0", "--inventory", fleet.inventory, "--json")
    r = json.loads(out)["hosts"][0]
    assert code == 6 and "not from site_packages" in r["message"], out + err
    # the inventory fixed (its own site-packages): both pass, and the proof is in the result
    fleet.overrides["fake0"]["site_packages"] = str(h.site)
    fleet.rewrite_inventory()
    assert cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory)[0] == 0
    code, out, err = cli("smoke", "fake0", "--inventory", fleet.inventory, "--json")
    assert code == 0 and json.loads(out)["hosts"][0]["data"]["import_check"]["found"] == [str((h.site / "sglang").resolve())]


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_broken_backup_refuses_rollback_before_any_write(fleet, builds, cli, light_site, damage):
    """Issue 10: one bad backup among several files must not leave the host half-restored."""
    h = fleet.host("fake0")
    assert cli("push", "fake0", "--build", builds["big"], "--inventory", fleet.inventory)[0] == 0
    (rec,) = records(h)
    deployed = tree_hashes(h.site)
    # the LAST file of the record: a restore that checks as it goes would already have restored the others
    last = [f["path"] for f in rec["files"] if f["before_sha256"]][-1]
    bak = h.state_dir / "deploys" / rec["deploy_id"] / "backup" / last
    bak.unlink() if damage == "missing" else bak.write_bytes(b"corrupted")
    code, out, err = cli("rollback", "fake0", "--inventory", fleet.inventory, "--json")
    assert code == 9, out + err
    r = json.loads(out)["hosts"][0]
    found = "missing" if damage == "missing" else "corrupt: sha256 " + hashlib.sha256(b"corrupted").hexdigest()
    assert f"backup of {last} (deploy {rec['deploy_id']}) is {found}" in r["message"], r["message"]
    assert "untouched" in r["message"] and "status" in r["hint"]
    assert tree_hashes(h.site) == deployed and no_temp_files(h)  # not one file restored
    assert records(h)[0]["status"] == "deployed"  # nothing was changed, so nothing is mixed
    assert "refused" in audit(h)[-1]["result"]
    assert not (h.state_dir / "lock").exists()
    # a human repairs the backup; rollback then succeeds, byte-exact (content, mode, mtime, dirs)
    bak.parent.mkdir(parents=True, exist_ok=True)
    src = light_site / last
    bak.write_bytes(src.read_bytes())
    os.utime(bak, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns))
    assert cli("rollback", "fake0", "--inventory", fleet.inventory)[0] == 0
    assert tree_hashes(h.site) == tree_hashes(light_site)


def test_rollback_refuses_a_file_edited_on_the_host_unless_force_keeps_a_copy(fleet, builds, cli, light_site):
    h = fleet.host("fake0")
    assert cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory)[0] == 0
    (rec,) = records(h)
    edited = h.site / SPEC_INFO
    edited.write_bytes(edited.read_bytes() + b"# a hot fix made by hand on the host\n")
    after_edit = tree_hashes(h.site)
    code, out, err = cli("rollback", "fake0", "--inventory", fleet.inventory, "--json")
    assert code == 6, out + err
    r = json.loads(out)["hosts"][0]
    assert SPEC_INFO in r["message"] and "edited on the host" in r["message"] and "--force" in (r["hint"] or "")
    assert tree_hashes(h.site) == after_edit and records(h)[0]["status"] == "deployed"
    # --dry-run says the same and writes nothing (no lock, no audit line)
    n_audit = len(audit(h))
    code, out, err = cli("rollback", "fake0", "--dry-run", "--inventory", fleet.inventory, "--json")
    assert code == 0
    r = json.loads(out)["hosts"][0]
    assert r["status"] == "would-roll-back" and "WOULD BE REFUSED" in r["message"] and SPEC_INFO in r["message"]
    assert len(audit(h)) == n_audit and tree_hashes(h.site) == after_edit
    # --force: the edited file is kept (verified) in the state dir, then the host is restored
    edit_bytes = edited.read_bytes()
    code, out, err = cli("rollback", "fake0", "--force", "--inventory", fleet.inventory, "--json")
    assert code == 0, out + err
    r = json.loads(out)["hosts"][0]
    (kept,) = r["data"]["kept"]
    assert Path(kept).read_bytes() == edit_bytes and Path(kept).is_relative_to(h.state_dir / "edited")
    assert tree_hashes(h.site) == tree_hashes(light_site)


def test_rollback_dry_run_lists_what_it_would_restore_and_writes_nothing(fleet, builds, cli):
    h = fleet.host("fake0")
    assert cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory)[0] == 0
    (rec,) = records(h)
    deployed, state = tree_hashes(h.site), tree_hashes(h.state_dir)
    code, out, err = cli("rollback", "fake0", "-n", "--inventory", fleet.inventory, "--json")
    assert code == 0, err
    doc = json.loads(out)
    r = doc["hosts"][0]
    assert doc["dry_run"] is True and r["status"] == "would-roll-back" and r["deploy_id"] == rec["deploy_id"]
    (step,) = r["data"]["would_undo"]
    assert sorted(f["path"] for f in step["files"]) == sorted(f["path"] for f in rec["files"])
    assert tree_hashes(h.site) == deployed and tree_hashes(h.state_dir) == state


def test_lock_release_dry_run_names_the_holder_and_writes_nothing(fleet, cli):
    h = fleet.host("fake0")
    lock = h.state_dir / "lock"
    lock.mkdir(parents=True)
    (lock / "info.json").write_text(json.dumps({"who": "alice@laptop", "deploy_id": "D1", "op": "push"}))
    state = tree_hashes(h.state_dir)
    code, out, err = cli("lock", "release", "fake0", "--dry-run", "--inventory", fleet.inventory)
    assert code == 0 and "would-release" in out and "alice@laptop" in out
    assert tree_hashes(h.state_dir) == state


def test_dry_run_writes_nothing_and_shows_diff(fleet, builds, cli):
    h = fleet.host("fake0")
    before = tree_hashes(h.site)
    code, out, err = cli("push", "fake0", "--dry-run", "--build", builds["good"], "--inventory", fleet.inventory)
    assert code == 0, err
    assert "+def ddtree_test_marker():" in out and "--- /dev/null" in out
    code, short, err = cli(
        "push", "fake0", "--dry-run", "--diff-lines", "2", "--build", builds["good"], "--inventory", fleet.inventory
    )
    assert code == 0, err
    assert "+def ddtree_test_marker():" not in short and "more diff line(s)" in short
    assert tree_hashes(h.site) == before
    assert not h.state_dir.exists()


# --- refusals before any write -----------------------------------------------------------------------


def test_unknown_host_key_refused_then_accepted(fleet, builds, cli):
    h = fleet.host("fake0")
    h.known_hosts.write_text("")
    before = tree_hashes(h.site)
    code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
    assert code == 6
    r = json.loads(out)["hosts"][0]
    assert r["error"] == "HostKeyError" and "unknown host key" in r["message"] and "SHA256:" in r["message"]
    assert "--accept-new-host-key" in r["hint"]
    assert h.known_hosts.read_text() == "" and tree_hashes(h.site) == before and not h.state_dir.exists()
    code, out, err = cli("status", "fake0", "--inventory", fleet.inventory, "--accept-new-host-key")
    assert code == 0, err
    assert f"[{h.addr}]:{h.port} ssh-ed25519" in h.known_hosts.read_text()
    assert cli("status", "fake0", "--inventory", fleet.inventory)[0] == 0  # now known


def test_changed_host_key_refused_even_with_accept_new(fleet, builds, cli):
    h = fleet.host("fake0")
    port = h.port
    h.stop()
    h.regenerate_host_key()
    h.start(port)
    before = tree_hashes(h.site)
    for extra in ([], ["--accept-new-host-key"]):
        code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory, "--json", *extra)
        assert code == 6
        r = json.loads(out)["hosts"][0]
        assert r["error"] == "HostKeyError" and "CHANGED" in r["message"] and "ssh-keygen -R" in r["hint"]
    assert tree_hashes(h.site) == before and not h.state_dir.exists()


def test_host_known_with_another_key_type_refused(fleet, builds, cli, tmp_path):
    h = fleet.host("fake1")
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(tmp_path / "other")], check=True)
    t, b64 = (tmp_path / "other.pub").read_text().split()[:2]
    h.known_hosts.write_text(f"[{h.addr}]:{h.port} {t} {b64}\n")
    code, out, err = cli(
        "push", "fake1", "--build", builds["good"], "--inventory", fleet.inventory, "--json", "--accept-new-host-key"
    )
    assert code == 6
    r = json.loads(out)["hosts"][0]
    assert r["error"] == "HostKeyError" and ("CHANGED" in r["message"] or "ecdsa" in r["message"])
    assert "ssh-ed25519" not in h.known_hosts.read_text() and not h.state_dir.exists()


def test_drifted_host_refused_before_any_write_others_continue(fleet, builds, cli):
    h0, h1 = fleet.hosts
    with open(h0.site / SPEC_INFO, "ab") as fh:
        fh.write(b"# local hotfix\n")
    before = tree_hashes(h0.site)
    code, out, err = cli("push", "--all", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
    assert code == 10  # several hosts asked, some failed
    r0, r1 = json.loads(out)["hosts"]
    assert r0["error"] == "DriftError" and r0["exit_code"] == 6 and SPEC_INFO in r0["message"]
    assert r1["status"] == "deployed"
    assert tree_hashes(h0.site) == before and not h0.state_dir.exists()
    code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory)
    assert code == 6
    code, out, err = cli("status", "fake0", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
    states = {f["path"]: f["state"] for f in json.loads(out)["hosts"][0]["data"]["files"]}
    assert states[SPEC_INFO] == "unknown"


def test_permission_denied_immutable_file(fleet, builds, cli):
    h = fleet.host("fake0")
    target = h.site / SPEC_INFO
    if subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i not supported on this filesystem")
    try:
        before = tree_hashes(h.site)
        code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
        assert code == 6
        r = json.loads(out)["hosts"][0]
        assert "permission denied" in r["message"] and SPEC_INFO in r["message"]
        assert tree_hashes(h.site) == before and not h.state_dir.exists()
    finally:
        subprocess.run(["chattr", "-i", str(target)])


def test_permission_denied_read_only_bind_mount(fleet, builds, cli):
    h = fleet.host("fake1")
    h.stop()
    h.start(h.port, clean_shell=False)  # its sshd must see our mounts: no private mount namespace
    d = h.site / "sglang" / "srt" / "speculative"
    if subprocess.run(["mount", "--bind", "-o", "ro", str(d), str(d)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount read-only here")
    try:
        code, out, err = cli("push", "fake1", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
        assert code == 6, err
        assert "permission denied" in json.loads(out)["hosts"][0]["message"]
        assert not h.state_dir.exists()
    finally:
        subprocess.run(["umount", str(d)])


def test_disk_full(tmp_path, light_site, builds, cli, monkeypatch):
    """A small tmpfs as the host's site-packages: preflight refuses; forced past it, ENOSPC rolls back."""
    f = start_fleet(tmp_path, 1, light_site)
    h = f.hosts[0]
    h.stop()
    h.start(h.port, clean_shell=False)  # its sshd must see our mounts: no private mount namespace
    mnt = h.site / "sglang" / "srt" / "speculative"
    saved = tmp_path / "saved"
    import shutil

    shutil.copytree(mnt, saved)
    size = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file())
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size + (1 << 20)}", "tmpfs", str(mnt)], capture_output=True
        ).returncode
        != 0
    ):
        f.stop()
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        shutil.copytree(saved, mnt, dirs_exist_ok=True)
        before = tree_hashes(h.site)
        code, out, err = cli("push", "fake0", "--build", builds["big"], "--inventory", f.inventory, "--json")
        assert code == 6
        assert "not enough free disk" in json.loads(out)["hosts"][0]["message"]
        assert tree_hashes(h.site) == before and not h.state_dir.exists()
        # the test hook variable cannot switch the disk check off...
        os.environ["DDTREE_DEPLOY_TEST_HOOKS"] = json.dumps({"skip_disk_check": 1})
        try:
            code, out, err = cli("push", "fake0", "--build", builds["big"], "--inventory", f.inventory)
            assert code == 2 and "unknown hook(s) skip_disk_check" in err
        finally:
            del os.environ["DDTREE_DEPLOY_TEST_HOOKS"]
        # ...a test injects it instead (in-process), to reach the ENOSPC path on the host
        from ddtree_deploy.remote import hostops

        monkeypatch.setattr(hostops, "check_disk", lambda *a, **k: None)
        code, out, err = cli("push", "fake0", "--build", builds["big"], "--inventory", f.inventory, "--json")
        assert code == 8, out + err  # failed after writing, restored and verified
        r = json.loads(out)["hosts"][0]
        assert "No space left" in r["message"] and "restored" in r["message"]
        assert tree_hashes(h.site) == before and no_temp_files(h)
        assert records(h)[0]["status"] == "aborted"
    finally:
        subprocess.run(["umount", str(mnt)])
        f.stop()


def test_full_state_disk_still_ends_with_an_honest_record_and_audit_line(tmp_path, light_site, builds, cli, monkeypatch):
    """The state dir fills up while backing up: the outcome is still recorded ("aborted") and audited,
    thanks to the space reserved before the first write; a state dir too small for even that refuses."""
    from ddtree_deploy.remote import agent, hostops

    f = start_fleet(tmp_path, 1, light_site)
    h = f.hosts[0]
    h.stop()
    h.start(h.port, clean_shell=False)
    sd = h.state_dir
    sd.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(hostops, "check_disk", lambda *a, **k: None)  # get past preflight (injected, in-process)
    big = builds["big"]
    mounted = False
    try:
        # 1. too small for the reserve itself: refused before any write, nothing left behind
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(sd)], capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here (not root?)")
        mounted = True
        before = tree_hashes(h.site)
        code, out, err = cli("push", "fake0", "--build", big, "--inventory", f.inventory, "--json")
        r = json.loads(out)["hosts"][0]
        assert code == 6 and "cannot write the deploy record" in r["message"], out + err
        assert tree_hashes(h.site) == before and records(h) == [] and not (sd / "lock").exists()
        subprocess.run(["umount", str(sd)], check=True)
        # 2. room for the reserve, the lock, the record (and its temp copy) and the first backup, not the second
        first, second = [p for p in manifest_hashes(big) if (light_site / p).exists()][:2]
        pages = lambda p: -(-(light_site / p).stat().st_size // 4096)  # noqa: E731
        assert pages(second) > 1
        size = agent.RESERVE_MIN + 4096 * (3 + pages(first) + 1)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(sd)], check=True)
        code, out, err = cli("push", "fake0", "--build", big, "--inventory", f.inventory, "--json")
        r = json.loads(out)["hosts"][0]
        assert code == 8 and "No space left" in r["message"], out + err
        assert "NOT RECORDED" not in r["message"]
        assert tree_hashes(h.site) == before and no_temp_files(h)
        (rec,) = records(h)
        assert rec["status"] == "aborted"  # not left at backing-up ("interrupted, the host may be mixed")
        assert audit(h)[-1]["deploy_id"] == rec["deploy_id"] and audit(h)[-1]["result"].startswith("aborted")
        assert not (sd / "deploys" / rec["deploy_id"] / "reserve").exists()
    finally:
        if mounted:
            subprocess.run(["umount", str(sd)])
        f.stop()


# --- failures after writing ---------------------------------------------------------------------------


def test_smoke_failure_rolls_back_to_pristine(fleet, builds, cli):
    h = fleet.host("fake0")
    before = tree_hashes(h.site)
    code, out, err = cli("push", "fake0", "--build", builds["bad"], "--inventory", fleet.inventory, "--json")
    assert code == 8, err
    r = json.loads(out)["hosts"][0]
    assert r["error"] == "RolledBackError" and "smoke failed" in r["message"]
    assert "ddtree smoke failure on purpose" in r["data"]["checks"]["output_tail"]
    # everything was uploaded before it was rolled back: the counts say so
    sizes = [(builds["bad"] / p).stat().st_size for p in manifest_hashes(builds["bad"])]
    assert (r["files_sent"], r["bytes_sent"]) == (len(sizes), sum(sizes))
    assert tree_hashes(h.site) == before and no_temp_files(h)
    (rec,) = records(h)
    assert rec["status"] == "rolled-back"
    assert audit(h)[-1]["result"].startswith("rolled-back")
    assert not (h.state_dir / "lock").exists()


def test_smoke_timeout_rolls_back(fleet, builds, cli):
    fleet.overrides["fake0"]["smoke_timeout"] = 2
    fleet.rewrite_inventory()
    h = fleet.host("fake0")
    before = tree_hashes(h.site)
    code, out, err = cli("push", "fake0", "--build", builds["slow"], "--inventory", fleet.inventory, "--json")
    assert code == 8
    r = json.loads(out)["hosts"][0]
    assert "timed out after 2" in r["data"]["checks"]["output_tail"]
    assert tree_hashes(h.site) == before


def test_restart_without_restart_command_is_refused_before_writing(fleet, builds, cli):
    code, out, err = cli("push", "fake0", "--restart", "--build", builds["good"], "--inventory", fleet.inventory)
    assert code == 2 and "restart_command" in err
    assert not fleet.host("fake0").state_dir.exists()


def _start_push(fleet, build, host="fake0", hooks=None, extra=()):
    env = {"DDTREE_DEPLOY_TEST_HOOKS": json.dumps(hooks)} if hooks else {}
    return cli_subprocess(["push", host, "--build", str(build), "--inventory", str(fleet.inventory), *extra], env)


def test_connection_killed_mid_upload_leaves_host_pristine(fleet, builds, cli):
    h = fleet.host("fake0")
    before = tree_hashes(h.site)
    p = _start_push(fleet, builds["big"], hooks={"throttle": 0.02})
    try:
        assert wait_for(lambda: len(__import__("ddtree_deploy.testing_sshd", fromlist=["x"]).descendants(h.proc.pid)) >= 2, 20)
        time.sleep(1.0)  # well into the (throttled) 3 MB upload
        h.stop()  # the sshd and all its sessions die
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 13, err  # could not reach / lost the connection: its own documented code
    assert b"connection" in err.lower() or b"closed" in err.lower()
    assert tree_hashes(h.site) == before and no_temp_files(h)
    assert not (h.state_dir / "lock").exists()
    h.start(h.port)
    code, out, err = cli("status", "fake0", "--inventory", fleet.inventory, "--json")
    assert code == 0 and json.loads(out)["hosts"][0]["data"]["interrupted"] == []


def test_connection_killed_mid_commit_is_recorded_and_rollback_recovers(fleet, builds, cli):
    h = fleet.host("fake0")
    before = tree_hashes(h.site)
    p = _start_push(fleet, builds["big"], hooks={"between_renames": 1.0})
    try:

        def writing():
            rs = records(h) if (h.state_dir / "deploys").exists() else []
            return rs and rs[-1]["status"] == "writing"

        assert wait_for(writing, 30, 0.01)
        time.sleep(1.2)  # one rename done, the rest not: the host is mixed
        h.stop()  # kills the agent too (SIGKILL to every descendant of sshd)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode != 0
    assert tree_hashes(h.site) != before  # mixed...
    (rec,) = records(h)
    assert rec["status"] == "writing"  # ...but recorded
    assert (h.state_dir / "lock").exists()
    h.start(h.port)
    code, out, err = cli("status", "fake0", "--inventory", fleet.inventory, "--json")
    st = json.loads(out)["hosts"][0]
    assert st["data"]["interrupted"] == [rec["deploy_id"]] and "rollback" in st["message"]
    assert code == 0 and cli("status", "fake0", "--strict", "--inventory", fleet.inventory)[0] == 14
    code, out, err = cli("push", "fake0", "--build", builds["big"], "--inventory", fleet.inventory, "--json")
    assert code == 7 and "process is gone" in json.loads(out)["hosts"][0]["message"]
    code, out, err = cli("rollback", "fake0", "--inventory", fleet.inventory)
    assert code == 0, err
    assert tree_hashes(h.site) == before and no_temp_files(h)
    assert not (h.state_dir / "lock").exists()
    assert records(h)[0]["status"] == "rolled-back"


def test_file_changed_between_preflight_and_lock_is_refused_under_the_lock(fleet, builds):
    """The agent re-checks every target's hash once it holds the lock (the preflight's answer is stale)."""
    import threading

    h = fleet.host("fake0")
    p = _start_push(fleet, builds["good"], hooks={"after_receive": 3.0})
    seen = threading.Event()
    lines: list[bytes] = []

    def read_err():
        for line in p.stderr:
            lines.append(line)
            if b"receiving" in line:
                seen.set()

    t = threading.Thread(target=read_err, daemon=True)
    t.start()
    try:
        assert seen.wait(30), b"".join(lines)
        time.sleep(0.5)  # the payload is in; the agent sleeps before taking the lock
        target = h.site / SPEC_INFO
        target.write_bytes(target.read_bytes() + b"# changed by someone else meanwhile\n")
        edited = tree_hashes(h.site)
        p.wait(timeout=60)
        t.join(10)
    finally:
        p.kill()
    err = b"".join(lines).decode()
    assert p.returncode == 6, err
    assert f"{SPEC_INFO} changed since preflight" in err
    assert tree_hashes(h.site) == edited and no_temp_files(h)  # nothing written, the edit kept
    assert records(h) == [] and not (h.state_dir / "lock").exists()
    assert audit(h)[-1]["result"].startswith("refused: " + SPEC_INFO)


@contextlib.contextmanager
def _push_held_while_staging(fleet, build, delay=2.0):
    """A push of ``build`` to fake0 held ``delay`` s before its commit: yields (process, host) once its
    record says staging; the process is killed on the way out."""
    h = fleet.host("fake0")
    p = _start_push(fleet, build, hooks={"before_commit": delay})
    try:

        def staged():
            rs = records(h) if (h.state_dir / "deploys").exists() else []
            return rs and rs[-1]["status"] == "staging"

        assert wait_for(staged, 30, 0.01)
        yield p, h
    finally:
        p.kill()


def test_backup_damaged_during_a_failing_push_ends_needs_human_naming_it(fleet, builds):
    """The push's own restore re-checks each backup: one damaged mid-push is named, not restored from."""
    with _push_held_while_staging(fleet, builds["bad"]) as (p, h):
        (rec,) = records(h)
        before = next(f["before_sha256"] for f in rec["files"] if f["path"] == SPEC_INFO)
        # damage that sorts below the real hash (a check that only compared one way would miss it)
        damage = next(b"damaged %d" % n for n in range(64) if hashlib.sha256(b"damaged %d" % n).hexdigest() < before)
        (h.state_dir / "deploys" / rec["deploy_id"] / "backup" / SPEC_INFO).write_bytes(damage)
        out, err = p.communicate(timeout=90)
    assert p.returncode == 9, err
    (rec,) = records(h)
    assert rec["status"] == "needs-human"
    probs = rec["restore_problems"]
    assert f"backup of {SPEC_INFO} is missing or corrupt" in probs
    want = manifest_hashes(builds["bad"])[SPEC_INFO]
    assert any(pr.startswith(f"{SPEC_INFO}: sha256 {want} after restore, expected ") for pr in probs), probs
    assert host_hashes(h, [SPEC_INFO]) == {SPEC_INFO: want} and no_temp_files(h)


def test_target_replaced_by_a_directory_mid_push_ends_needs_human_naming_the_error(fleet, builds):
    import shutil

    with _push_held_while_staging(fleet, builds["bad"]) as (p, h):
        time.sleep(0.3)
        target = h.site / SPEC_INFO
        target.unlink()
        target.mkdir()
        (target / "x").write_text("someone else's")
        out, err = p.communicate(timeout=90)
    assert p.returncode == 9, err
    (rec,) = records(h)
    assert rec["status"] == "needs-human"
    assert any(pr.startswith(f"{SPEC_INFO}: [Errno 21] Is a directory") for pr in rec["restore_problems"]), rec
    shutil.rmtree(target)


def test_a_file_already_back_to_pristine_needs_no_backup(fleet, builds, cli, light_site):
    """Someone restored one file by hand and removed its backup: rollback restores the rest."""
    import shutil

    h = fleet.host("fake0")
    assert cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory)[0] == 0
    (rec,) = records(h)
    shutil.copy2(light_site / SPEC_INFO, h.site / SPEC_INFO)
    (h.state_dir / "deploys" / rec["deploy_id"] / "backup" / SPEC_INFO).unlink()
    code, out, err = cli("rollback", "fake0", "--inventory", fleet.inventory)
    assert code == 0, err
    assert tree_hashes(h.site) == tree_hashes(light_site)


def test_rollback_keeps_a_created_directory_someone_put_files_in(fleet, builds, cli):
    h = fleet.host("fake0")
    assert cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory)[0] == 0
    (rec,) = records(h)
    assert "sglang/srt/speculative/ddtree_pkg/sub" in rec["created_dirs"]
    foreign = h.site / "sglang/srt/speculative/ddtree_pkg/notes.txt"
    foreign.write_text("not ours")
    code, out, err = cli("rollback", "fake0", "--inventory", fleet.inventory)
    assert code == 0, err
    assert foreign.read_text() == "not ours"  # its directory stays; ours (sub/) is gone
    assert not (h.site / "sglang/srt/speculative/ddtree_pkg/sub").exists()
    assert records(h)[0]["status"] == "undone"


def test_connection_cut_after_upload_host_finishes_on_its_own(fleet, builds):
    h = fleet.host("fake0")
    p = _start_push(fleet, builds["good"], hooks={"before_commit": 1.0})
    try:
        assert wait_for(lambda: (h.state_dir / "lock" / "info.json").exists(), 30)
        h.kill_sessions()  # the network drops; the agent on the host keeps going
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 13 and b"connection" in err.lower()
    assert b"rollback" in err  # the hint says how to check / undo
    assert wait_for(lambda: records(h) and records(h)[-1]["status"] == "deployed" and not (h.state_dir / "lock").exists(), 30)
    want = manifest_hashes(builds["good"])
    assert host_hashes(h, want) == want and no_temp_files(h)


def test_concurrent_push_refused_by_lock_naming_holder(fleet, builds, cli):
    h = fleet.host("fake0")
    p = _start_push(fleet, builds["good"], hooks={"before_commit": 4}, extra=["--why", "first push"])
    try:
        assert wait_for(lambda: (h.state_dir / "lock" / "info.json").exists(), 30)
        code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
        assert code == 7
        msg = json.loads(out)["hosts"][0]["message"]
        assert "lock held by" in msg and "first push" in msg and "@" in msg
        code, out, err = cli("lock", "status", "fake0", "--inventory", fleet.inventory)
        assert code == 0 and "held" in out and "alive" in out
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    finally:
        p.kill()
    assert not (h.state_dir / "lock").exists()
    code, out, err = cli("lock", "status", "fake0", "--inventory", fleet.inventory)
    assert code == 0 and "free" in out


def test_finishing_push_does_not_drop_a_lock_it_no_longer_holds(fleet, builds, cli):
    h = fleet.host("fake0")
    p = _start_push(fleet, builds["good"], hooks={"before_commit": 2})
    try:
        assert wait_for(lambda: (h.state_dir / "lock" / "info.json").exists(), 30)
        assert cli("lock", "release", "fake0", "--inventory", fleet.inventory)[0] == 0
        (h.state_dir / "lock").mkdir()  # someone else takes the lock meanwhile
        (h.state_dir / "lock" / "info.json").write_text(json.dumps({"who": "other@host", "pid": 1}))
        p.communicate(timeout=60)
    finally:
        p.kill()
    assert json.loads((h.state_dir / "lock" / "info.json").read_text())["who"] == "other@host"


def test_lock_release(fleet, cli):
    h = fleet.host("fake1")
    (h.state_dir / "lock").mkdir(parents=True)
    (h.state_dir / "lock" / "info.json").write_text(json.dumps({"who": "someone@else", "deploy_id": "x"}))
    code, out, err = cli("lock", "release", "fake1", "--inventory", fleet.inventory)
    assert code == 0 and "someone@else" in out
    assert not (h.state_dir / "lock").exists()
    assert audit(h)[-1]["op"] == "lock-release"


def test_ctrl_c_mid_upload_leaves_consistent_recorded_state(fleet, builds):
    h = fleet.host("fake0")
    before = tree_hashes(h.site)
    p = _start_push(fleet, builds["big"], hooks={"throttle": 0.02})
    try:
        deadline = time.monotonic() + 30
        buf = b""
        os.set_blocking(p.stderr.fileno(), False)
        while b"uploading" not in buf and time.monotonic() < deadline:
            time.sleep(0.05)
            buf += p.stderr.read() or b""
        assert b"uploading" in buf
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130
    assert wait_for(lambda: not (h.state_dir / "lock").exists(), 20)
    assert tree_hashes(h.site) == before and no_temp_files(h)
    assert wait_for(lambda: audit(h) and "aborted" in audit(h)[-1]["result"], 20)


def test_ctrl_c_after_upload_host_finishes_and_records(fleet, builds):
    h = fleet.host("fake0")
    p = _start_push(fleet, builds["good"], hooks={"before_commit": 1.5})
    try:
        assert wait_for(lambda: (h.state_dir / "lock" / "info.json").exists(), 30)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130
    assert wait_for(lambda: records(h) and records(h)[-1]["status"] == "deployed" and not (h.state_dir / "lock").exists(), 30)
    want = manifest_hashes(builds["good"])
    assert host_hashes(h, want) == want


# --- quoting ---------------------------------------------------------------------------------------


def test_paths_with_spaces_and_shell_metacharacters(tmp_path, light_site, builds, cli):
    weird = "host a;$(touch PWNED)`touch PWNED2` 'q\"b&|<>"
    f = start_fleet(tmp_path, 1, light_site, root_names=[weird])
    try:
        h = f.hosts[0]
        assert " " in str(h.python) and "$(" in str(h.state_dir)
        before = tree_hashes(h.site)
        code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", f.inventory)
        assert code == 0, err
        assert host_hashes(h, manifest_hashes(builds["good"])) == manifest_hashes(builds["good"])
        assert cli("smoke", "fake0", "--inventory", f.inventory)[0] == 0
        assert cli("rollback", "fake0", "--inventory", f.inventory)[0] == 0
        assert tree_hashes(h.site) == before
        for d in (Path.home(), Path.cwd(), tmp_path, h.root):
            assert not list(d.glob("PWNED*"))
    finally:
        f.stop()


# --- inventory / usage ---------------------------------------------------------------------------


def test_demo_fails_when_the_repo_series_does_not_build(tmp_path, repo):
    """No stand-in build: a series that does not apply makes `demo` (and so `make demo`) fail with its code."""
    import shutil

    fake = tmp_path / "repo"
    (fake / "snapshot").mkdir(parents=True)
    shutil.copy(repo / "snapshot" / "sglang-0.5.23.toml", fake / "snapshot")
    series = fake / "patches" / "sglang-0.5.23"
    series.mkdir(parents=True)
    (series / "series").write_text("0001-stale.patch\n")
    (series / "0001-stale.patch").write_text(
        "--- a/sglang/srt/speculative/spec_info.py\n+++ b/sglang/srt/speculative/spec_info.py\n"
        "@@ -1,1 +1,1 @@\n-this line is not in the pinned file\n+x\n"
    )
    p = cli_subprocess(["demo", "--light-smoke"], {"DDTREE_DEPLOY_REPO": str(fake)})
    out, err = p.communicate(timeout=300)
    assert p.returncode == 4, err
    assert b"0001-stale.patch" in err and b"demo ok" not in err and b"stand-in" not in err


def test_tampered_build_dir_is_refused_with_exit_2_before_connecting(fleet, builds, cli, tmp_path):
    import shutil

    h = fleet.host("fake0")
    bad = tmp_path / "tampered"
    shutil.copytree(builds["good"], bad)
    (bad / SPEC_INFO).write_bytes((bad / SPEC_INFO).read_bytes() + b"# sneaked in\n")
    before = tree_hashes(h.site)
    code, out, err = cli("push", "fake0", "--build", bad, "--inventory", fleet.inventory)
    assert code == 2 and "does not match its manifest hash" in err and "fix:" in err
    assert tree_hashes(h.site) == before and not h.state_dir.exists()


def test_unreachable_host_exits_13_and_others_still_answer(fleet, cli):
    fleet.host("fake1").stop()
    code, out, err = cli("status", "fake1", "--inventory", fleet.inventory, "--json")
    r = json.loads(out)["hosts"][0]
    assert code == 13 and r["status"] == "unreachable" and "cannot connect" in r["message"]
    assert "retry" in r["hint"]
    code, out, err = cli("status", "fake0", "fake1", "--inventory", fleet.inventory, "--json")
    assert code == 10 and [h["exit_code"] for h in json.loads(out)["hosts"]] == [0, 13]


def test_status_strict_exits_14_on_drift_only(fleet, builds, cli):
    assert cli("status", "fake0", "--strict", "--inventory", fleet.inventory, "--build", builds["good"])[0] == 0
    (fleet.host("fake0").site / SPEC_INFO).write_bytes(b"# edited by hand\n")
    code, out, err = cli("status", "fake0", "--inventory", fleet.inventory, "--build", builds["good"])
    assert code == 0 and "unknown" in out
    code, out, err = cli("status", "fake0", "--strict", "--inventory", fleet.inventory, "--build", builds["good"], "--json")
    doc = json.loads(out)
    assert code == 14 and doc["exit_code"] == 14 and doc["attention"] == ["fake0"] and "needs attention" in err


def test_unknown_host_and_bad_inventory(fleet, cli, tmp_path):
    code, out, err = cli("push", "nosuch", "--inventory", fleet.inventory, "--build", tmp_path)
    assert code == 2 and "nosuch" in err and "fake0" in err
    bad = tmp_path / "bad.toml"
    bad.write_text("[hosts.x]\ntarget = 1\n")
    code, out, err = cli("status", "x", "--inventory", bad)
    assert code == 2 and "target" in err


def test_wrong_interpreter_is_reported(fleet, builds, cli):
    fleet.overrides["fake0"]["python"] = "/nonexistent/dir with space/python"
    fleet.rewrite_inventory()
    code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
    assert code == 6
    assert "cannot run the host's python" in json.loads(out)["hosts"][0]["message"]
    assert not fleet.host("fake0").state_dir.exists()


def test_wrong_interpreter_is_reported_when_the_agent_upload_breaks(fleet, builds, cli, monkeypatch):
    """The shell exits 127 before reading the agent's source, so sending it fails with "Socket is closed".

    A source larger than the SSH channel window (OpenSSH's 2 MiB) makes that send block until the channel
    closes, deterministically; on a loaded CI machine it also happens with the real, small source. It is the
    host's python that is wrong (exit 6), not the connection (13)."""
    from ddtree_deploy.remote import connection

    monkeypatch.setattr(connection, "_AGENT_SRC", connection._AGENT_SRC + b"#" * (8 << 20) + b"\n")
    fleet.overrides["fake0"]["python"] = "/nonexistent/dir with space/python"
    fleet.rewrite_inventory()
    code, out, err = cli("push", "fake0", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
    doc = json.loads(out)
    assert code == 6, doc["hosts"][0]["message"]
    assert "cannot run the host's python" in doc["hosts"][0]["message"]
    assert not fleet.host("fake0").state_dir.exists()


def test_shipped_inventory_parses(repo):
    from ddtree_deploy.remote.inventory import load_inventory

    inv = load_inventory(repo / "deploy" / "hosts.toml")
    assert {"ct129", "ct200"} <= set(inv.hosts)
    assert inv.hosts["ct129"].python.endswith("python")


# --- the service step -----------------------------------------------------------------------------


def test_restart_and_health_then_failed_health_rolls_back(fleet, builds, cli, tmp_path):
    import http.server
    import threading

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    marker = tmp_path / "restarted"
    try:
        fleet.overrides["fake0"].update(
            restart_command=f"echo x >> {marker}", health_url=f"http://127.0.0.1:{srv.server_address[1]}/", health_timeout=5
        )
        fleet.overrides["fake1"].update(restart_command=f"echo y >> {marker}", health_url="http://127.0.0.1:9/", health_timeout=2)
        fleet.rewrite_inventory()
        code, out, err = cli("push", "--all", "--restart", "--build", builds["good"], "--inventory", fleet.inventory, "--json")
        assert code == 10, err
        r0, r1 = json.loads(out)["hosts"]
        assert r0["status"] == "deployed" and "healthy" in r0["message"]
        assert r1["status"] == "rolled-back" and "health check" in r1["message"]
        assert marker.read_text().count("x") == 1 and marker.read_text().count("y") == 2  # restarted again after rollback
        h1 = fleet.host("fake1")
        assert records(h1)[0]["status"] == "undone"
        want = manifest_hashes(builds["good"])
        assert host_hashes(fleet.host("fake0"), want) == want
    finally:
        srv.shutdown()


def test_smoke_runs_modules_and_a_failing_run_rolls_back(fleet, light_site, cli, tmp_path):
    """``smoke_run`` modules (by default the DDTree probe) run as ``python -m M`` on the host after
    the imports; a non-zero exit fails the smoke, and push rolls the host back to pristine."""
    spec = (light_site / SPEC_INFO).read_bytes()
    check_mod = (
        b"import sys\nRC = 0\nif __name__ == '__main__':\n    print('self-check verdict: ' + sys.argv[0])\n    sys.exit(RC)\n"
    )
    ok = make_build(
        tmp_path / "ok",
        light_site,
        {
            SPEC_INFO: spec + MARKER,
            "sglang/srt/speculative/ddtree_smoke_ok.py": b"VALUE = 42\n",
            "sglang/srt/speculative/ddtree_selfcheck.py": check_mod,
        },
        "sglang-0.5.23+selfcheck-ok",
    )
    bad = make_build(
        tmp_path / "bad",
        light_site,
        {
            SPEC_INFO: spec + MARKER,
            "sglang/srt/speculative/ddtree_smoke_ok.py": b"VALUE = 42\n",
            "sglang/srt/speculative/ddtree_selfcheck.py": check_mod.replace(b"RC = 0", b"RC = 3"),
        },
        "sglang-0.5.23+selfcheck-bad",
    )
    fleet.overrides["fake0"]["smoke_run"] = ["sglang.srt.speculative.ddtree_selfcheck"]
    fleet.rewrite_inventory()
    h = fleet.host("fake0")
    before = tree_hashes(h.site)
    code, out, err = cli("push", "fake0", "--build", bad, "--inventory", fleet.inventory, "--json")
    assert code == 8, err
    r = json.loads(out)["hosts"][0]
    assert r["data"]["checks"]["failed_step"] == "run sglang.srt.speculative.ddtree_selfcheck"
    assert "self-check verdict" in r["data"]["checks"]["output_tail"]
    assert tree_hashes(h.site) == before
    code, out, err = cli("push", "fake0", "--build", ok, "--inventory", fleet.inventory, "--json")
    assert code == 0, err
    checks = json.loads(out)["hosts"][0]["data"]["checks"]
    assert checks["run"] == ["sglang.srt.speculative.ddtree_selfcheck"] and checks["ok"]
