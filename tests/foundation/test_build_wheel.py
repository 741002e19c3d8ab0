"""``build --wheel`` (issue 23 item 1): the pinned wheel with the build's files, a local version and a
correct RECORD, installable with a plain hash-pinned pip install. Every check here reads the wheel
and the installed files with zipfile/hashlib/csv directly, not with the code under test."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from testkit import run_cli


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory, snapshot_root):
    out = tmp_path_factory.mktemp("wb") / "build"
    r = run_cli("build", "--wheel", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def pinned_wheel() -> Path:
    from ddtree_deploy.pin import snapshot

    return snapshot.wheel_path()


def test_the_wheel_is_the_pinned_wheel_with_the_patched_files_and_a_correct_record(wheel_build):
    out, doc = wheel_build
    manifest = json.loads((out / "manifest.json").read_text())
    local = "0.5.23+ddtree." + manifest["series_id"].split("+", 1)[1]
    (whl,) = out.glob("*.whl")
    assert whl.name.startswith(f"sglang-{local}-") and doc["wheel"]["filename"] == whl.name
    assert doc["wheel"]["sha256"] == hashlib.sha256(whl.read_bytes()).hexdigest()
    req = (out / "requirements.txt").read_text().splitlines()[-1]
    assert req == f"sglang=={local} --hash=sha256:{doc['wheel']['sha256']}"
    files = {f["path"]: f for f in manifest["files"]}
    with zipfile.ZipFile(pinned_wheel()) as pz, zipfile.ZipFile(whl) as wz:
        pinned = {n: pz.read(n) for n in pz.namelist() if not n.endswith("/")}
        ours = {n: wz.read(n) for n in wz.namelist() if not n.endswith("/")}
    old_info, new_info = "sglang-0.5.23.dist-info/", f"sglang-{local}.dist-info/"
    for name, data in pinned.items():  # every member of the pinned wheel, byte for byte, but ours
        if name.startswith(old_info):
            continue
        f = files.get(name)
        if f is None:
            assert ours[name] == data, name
        elif f["action"] == "delete":
            assert name not in ours
        else:
            assert (
                hashlib.sha256(ours[name]).hexdigest()
                == f["patched_sha256"]
                == hashlib.sha256((out / name).read_bytes()).hexdigest()
            )
    for name, f in files.items():
        if f["action"] == "create":
            assert hashlib.sha256(ours[name]).hexdigest() == f["patched_sha256"]
    assert not any(n.startswith(old_info) for n in ours)
    metadata = ours[new_info + "METADATA"].decode()
    assert f"\nVersion: {local}\n" in metadata and "\nVersion: 0.5.23\n" not in metadata
    assert metadata.replace(f"Version: {local}", "Version: 0.5.23") == pinned[old_info + "METADATA"].decode()
    rows = list(csv.reader(io.StringIO(ours[new_info + "RECORD"].decode())))
    listed = {r[0] for r in rows}
    assert listed == set(ours), "RECORD lists every member, and only them"
    for path, digest, size in rows:
        if path == new_info + "RECORD":
            assert digest == "" and size == ""
        else:
            assert digest == record_hash(ours[path]) and int(size) == len(ours[path]), path


def test_the_wheel_installs_with_a_plain_hash_pinned_pip_install(wheel_build, tmp_path):
    out, doc = wheel_build
    manifest = json.loads((out / "manifest.json").read_text())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "--find-links", str(out),
         "--require-hashes", "--no-compile", "-q", "-r", str(out / "requirements.txt")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('sglang'))"], capture_output=True, text=True
    )
    assert got.stdout.strip() == doc["wheel"]["version"]
    (site,) = (venv / "lib").glob("python*/site-packages")
    for f in manifest["files"]:
        target = site / f["path"]
        assert (hashlib.sha256(target.read_bytes()).hexdigest() if target.exists() else None) == f["patched_sha256"]
    # the installed RECORD is a drift check: every file it lists has its hash
    (record,) = site.glob("sglang-*.dist-info/RECORD")
    for path, digest, _ in csv.reader(io.StringIO(record.read_text())):
        if digest:
            assert record_hash((site / path).read_bytes()) == digest, path
    # a tampered wheel is refused by pip's hash check
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    (whl,) = bad.glob("*.whl")
    whl.write_bytes(whl.read_bytes() + b"\0")
    venv2 = tmp_path / "venv2"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv2)], check=True)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv2 / "bin" / "python"), "install", "--no-deps", "--no-index",
         "--find-links", str(bad), "--require-hashes", "-q", "-r", str(bad / "requirements.txt")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode != 0 and "hash" in r.stderr.lower()


def test_the_wheel_is_reproducible(wheel_build, tmp_path):
    out, doc = wheel_build
    r = run_cli("build", "--wheel", "--out", str(tmp_path / "again"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["wheel"]["sha256"] == doc["wheel"]["sha256"]


def test_a_modified_build_wheel_is_refused(wheel_build, tmp_path):
    from ddtree_deploy.build.manifest import Manifest
    from ddtree_deploy.build.wheel import verify_wheel_file
    from ddtree_deploy.errors import UsageError

    out, _ = wheel_build
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (whl,) = copy.glob("*.whl")
    manifest = json.loads((copy / "manifest.json").read_text())
    victim = next(f["path"] for f in manifest["files"] if f["action"] != "delete")
    with zipfile.ZipFile(whl) as z:
        members = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(whl, "w") as z:
        for info, data in members:
            z.writestr(info, data + b"# sneaked in\n" if info.filename == victim else data)
    with pytest.raises(UsageError, match="the wheel was modified"):
        verify_wheel_file(whl, Manifest.load(copy))
