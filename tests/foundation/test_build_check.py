"""build / check / snapshot / authoring against the REAL pinned sglang 0.5.23 snapshot."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from testkit import git_diff, run_cli

from ddtree_deploy.build.build import build, check, resolve_inputs
from ddtree_deploy.build.manifest import Manifest
from ddtree_deploy.errors import FetchError, HashMismatchError, PatchApplyError
from ddtree_deploy.hashing import sha256_bytes, sha256_file
from ddtree_deploy.patches import authoring
from ddtree_deploy.patches.series import load_series
from ddtree_deploy.paths import default_pin_path
from ddtree_deploy.pin import snapshot
from ddtree_deploy.pin.pin import Pin, load_pin

SPEC = "sglang/srt/speculative/spec_info.py"
VERSION = "sglang/version.py"


@pytest.fixture
def two_patch_series(snapshot_root, make_series, tmp_path):
    """Patch 1 edits spec_info.py and creates a module; patch 2 edits the same file again."""
    pristine = (snapshot_root / SPEC).read_bytes()
    v1 = pristine.replace(b"class SpeculativeAlgorithm", b"# ddtree test marker\nclass SpeculativeAlgorithm", 1)
    assert v1 != pristine
    v2 = v1 + b"\n\ndef _ddtree_test_hook():\n    return 42\n"
    p1 = git_diff(pristine, v1, SPEC, tmp_path / "d1") + git_diff(None, b"X = 1\n", "sglang/srt/new_mod.py", tmp_path / "d1")
    p2 = git_diff(v1, v2, SPEC, tmp_path / "d2")
    d = make_series({"0001-marker.patch": p1, "0002-hook.patch": p2})
    series_pin(d, snapshot_root)
    return d, pristine, v2


def series_pin(series_dir, snapshot_root):
    """A pin for a test series (the repo pin's wheels; [files] = what this series touches), next to it."""
    repo_pin = load_pin(default_pin_path())
    pin = Pin(
        repo_pin.name, repo_pin.version, repo_pin.wheels, authoring.pin_files(repo_pin, load_series(series_dir), snapshot_root)
    )
    return pin.save(series_dir.parent / "pin.toml")


def test_build_writes_files_and_manifest(two_patch_series, snapshot_root, tmp_path):
    series_dir, pristine, v2 = two_patch_series
    out = tmp_path / "out"
    m = build(out, series_dir=series_dir, base_dir=snapshot_root, pin=False)
    assert (out / SPEC).read_bytes() == v2
    assert (out / "sglang/srt/new_mod.py").read_bytes() == b"X = 1\n"
    disk = Manifest.load(out / "manifest.json")
    assert disk.to_json() == m.to_json()
    entry = disk.file(SPEC)
    assert entry.action == "modify"
    assert entry.pristine_sha256 == sha256_bytes(pristine)
    assert entry.patched_sha256 == sha256_file(out / SPEC)
    assert entry.patches == ["0001-marker.patch", "0002-hook.patch"]
    assert entry.mode == "0644"
    new = disk.file("sglang/srt/new_mod.py")
    assert (new.action, new.pristine_sha256) == ("create", None)
    assert [p.sha256 for p in disk.patches] == [sha256_file(series_dir / p.name) for p in disk.patches]
    assert disk.series_id == load_series(series_dir).series_id


def test_nothing_is_written_unless_the_whole_series_applies(two_patch_series, snapshot_root, tmp_path):
    series_dir, _, _ = two_patch_series
    out = tmp_path / "out"
    build(out, series_dir=series_dir, base_dir=snapshot_root, pin=False)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # Break the LAST patch: its first context line no longer matches.
    p2 = series_dir / "0002-hook.patch"
    text = p2.read_bytes().splitlines(keepends=True)
    i = next(i for i, ln in enumerate(text) if ln.startswith(b" "))
    text[i] = b" DRIFTED" + text[i][1:]
    p2.write_bytes(b"".join(text))
    with pytest.raises(PatchApplyError) as ei:
        build(out, series_dir=series_dir, base_dir=snapshot_root, pin=False)
    assert ei.value.patch == "0002-hook.patch" and ei.value.file == SPEC
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # the previous build is untouched
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp dirs left


def test_check_reports_drift_in_the_base_with_file_and_hunk(two_patch_series, snapshot_root, tmp_path):
    """A drifted context line in the pristine tree: check exits 4 naming patch, file, hunk, line."""
    series_dir, pristine, _ = two_patch_series
    against = tmp_path / "site"
    (against / SPEC).parent.mkdir(parents=True)
    lines = pristine.splitlines(keepends=True)
    idx = next(i for i, ln in enumerate(lines) if b"class SpeculativeAlgorithm" in ln)
    lines[idx - 1] = lines[idx - 1].rstrip(b"\n") + b"  # local edit\n"  # a context line of hunk 1
    (against / SPEC).write_bytes(b"".join(lines))
    r = run_cli(
        "check", "--series", str(series_dir), "--against", str(against), "--json", "--pin", str(series_dir.parent / "pin.toml")
    )
    assert r.returncode == 4, r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] is False
    statuses = {p["name"]: p["status"] for p in rep["patches"]}
    assert statuses == {"0001-marker.patch": "failed", "0002-hook.patch": "not-reached"}
    e = rep  # one envelope for every --json (issue 23): the error's id in "error", its details after it
    assert e["error"] == "PatchApplyError" and e["exit_code"] == 4
    assert (e["patch"], e["file"], e["hunk"], e["line"]) == ("0001-marker.patch", SPEC, 1, idx)
    assert e["actual"].endswith("# local edit\n") and not e["expected"].endswith("# local edit\n")
    assert "hunk #1" in r.stderr and SPEC in r.stderr and "fix:" in r.stderr


def test_check_ok_json_and_pristine_tree(two_patch_series, snapshot_root):
    series_dir, _, _ = two_patch_series
    r = run_cli(
        "check",
        "--series",
        str(series_dir),
        "--against",
        str(snapshot_root),
        "--json",
        "--pin",
        str(series_dir.parent / "pin.toml"),
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and [p["status"] for p in rep["patches"]] == ["applied", "applied"]
    assert SPEC in rep["compiled"]


def test_repo_series_checks_and_git_apply_agrees(repo, snapshot_root, tmp_path):
    """The repo's own series: `ddtree-deploy check --json` exits 0, and `git apply`, patch by patch
    on a copy of the pristine files, produces exactly our build (a second opinion)."""
    r = run_cli("check", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["ok"] is True
    series = load_series(repo / "patches" / "sglang-0.5.23")
    out = tmp_path / "ours"
    m = build(out)
    work = tmp_path / "git"
    work.mkdir()
    for rel in series.touched_paths():
        if (snapshot_root / rel).is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(snapshot_root / rel, work / rel)
    for p in series.patches:
        chk = subprocess.run(["git", "apply", "--check", "-p1", str(p.path)], cwd=work, capture_output=True, text=True)
        assert chk.returncode == 0, f"git apply --check {p.name}: {chk.stderr}"
        subprocess.run(["git", "apply", "-p1", str(p.path)], cwd=work, check=True)
    for f in m.files:
        if f.action == "delete":
            assert not (work / f.path).exists()
        else:
            assert sha256_file(work / f.path) == f.patched_sha256, f.path


def test_repo_pin_covers_the_series_and_matches_the_snapshot(repo, snapshot_root):
    pin = load_pin(default_pin_path())
    series = load_series(repo / "patches" / "sglang-0.5.23")
    assert set(pin.files) == set(series.touched_paths())
    assert snapshot.verify_tree(pin, snapshot_root) == sorted(pin.files)


def test_snapshot_verify_names_file_and_both_hashes(snapshot_root, tmp_path):
    tree = tmp_path / "tree"
    (tree / VERSION).parent.mkdir(parents=True)
    good = (snapshot_root / VERSION).read_bytes()
    (tree / VERSION).write_bytes(good)
    pin = Pin("sglang", "0.5.23", [], {VERSION: sha256_bytes(good), "sglang/absent.py": "absent"})
    assert snapshot.verify_tree(pin, tree) == ["sglang/absent.py", VERSION]
    (tree / VERSION).write_bytes(good + b"#")
    with pytest.raises(HashMismatchError) as ei:
        snapshot.verify_tree(pin, tree)
    assert ei.value.what == VERSION
    assert ei.value.expected == sha256_bytes(good) and ei.value.actual == sha256_bytes(good + b"#")
    assert sha256_bytes(good) in str(ei.value) and sha256_bytes(good + b"#") in str(ei.value)


def test_fetch_refuses_a_tampered_wheel_and_unpacks_nothing(tmp_path, monkeypatch):
    real = snapshot.wheel_path()
    monkeypatch.setenv("DDTREE_DEPLOY_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / real.name
    bad.write_bytes(real.read_bytes() + b"\0")
    with pytest.raises(HashMismatchError) as ei:
        snapshot.fetch(load_pin(default_pin_path()), wheel=bad)
    assert ei.value.what == real.name
    assert not (tmp_path / "cache" / "snapshots").exists()
    other = tmp_path / "sglang-0.5.23-cp39-cp39-manylinux_2_34_x86_64.whl"
    other.write_bytes(b"x")
    with pytest.raises(FetchError, match="not a wheel the pin verified"):
        snapshot.fetch(load_pin(default_pin_path()), wheel=other)


def test_fetch_from_local_wheel_into_a_fresh_cache(tmp_path, monkeypatch):
    real = snapshot.wheel_path()
    monkeypatch.setenv("DDTREE_DEPLOY_CACHE", str(tmp_path / "cache"))
    s = snapshot.fetch(load_pin(default_pin_path()), wheel=real)
    assert s.root.is_relative_to(tmp_path / "cache")
    assert (s.package_dir / "srt" / "speculative" / "spec_info.py").is_file()
    assert (tmp_path / "cache" / "wheels" / real.name).is_file()
    assert snapshot.find_snapshot().root == s.root


def test_edit_refresh_roundtrip_is_byte_exact(two_patch_series, snapshot_root, tmp_path):
    series_dir, _, _ = two_patch_series
    inputs = resolve_inputs(series_dir, snapshot_root, False)
    # Canonicalize once (our patches came from `git diff --no-index`), then round-trip.
    authoring.edit(tmp_path / "wt0", inputs.series, snapshot_root, "sglang 0.5.23")
    authoring.refresh(tmp_path / "wt0", series_dir)
    canon = {p.name: p.read_bytes() for p in series_dir.iterdir()}
    inputs = resolve_inputs(series_dir, snapshot_root, False)
    res = authoring.edit(tmp_path / "wt", inputs.series, snapshot_root, "sglang 0.5.23")
    log = subprocess.run(["git", "-C", str(res.work_dir), "log", "--format=%s"], capture_output=True, text=True)
    assert log.stdout.split("\n")[:3] == ["0002-hook.patch", "0001-marker.patch", "pristine sglang 0.5.23"]
    rr = authoring.refresh(res.work_dir, series_dir)
    assert rr.written == [] and rr.removed == [] and not rr.series_rewritten
    assert {p.name: p.read_bytes() for p in series_dir.iterdir()} == canon
    # A new commit becomes a new patch at the end of the series.
    wt = res.work_dir
    (wt / VERSION).write_bytes((wt / VERSION).read_bytes() + b"# new\n")
    subprocess.run(
        ["git", "-C", str(wt), "commit", "-qam", "0003-version-note.patch"],
        check=True,
        env={
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    )
    rr = authoring.refresh(wt, series_dir)
    assert rr.written == ["0003-version-note.patch"] and rr.series_rewritten
    assert (series_dir / "series").read_text().splitlines()[-1] == "0003-version-note.patch"
    assert check(resolve_inputs(series_dir, snapshot_root, False)).ok


def test_refresh_refuses_uncommitted_changes_and_bad_subjects(two_patch_series, snapshot_root, tmp_path):
    from ddtree_deploy.errors import SeriesError, UsageError

    series_dir, _, _ = two_patch_series
    inputs = resolve_inputs(series_dir, snapshot_root, False)
    res = authoring.edit(tmp_path / "wt", inputs.series, snapshot_root, "sglang 0.5.23")
    (res.work_dir / VERSION).write_bytes(b"oops\n")
    with pytest.raises(UsageError, match="uncommitted"):
        authoring.refresh(res.work_dir, series_dir)
    subprocess.run(
        ["git", "-C", str(res.work_dir), "commit", "-qam", "fix stuff"],
        check=True,
        env={
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    )
    with pytest.raises(SeriesError, match="not a patch file name"):
        authoring.refresh(res.work_dir, series_dir)
    with pytest.raises(UsageError, match="not empty"):
        authoring.edit(res.work_dir, inputs.series, snapshot_root, "sglang 0.5.23")


def test_cli_exit_codes_and_streams(tmp_path, make_series):
    """Usage errors exit 2; a refused patch exits 4 with the error on stderr and JSON on stdout."""
    r = run_cli("check", "--no-such-flag")
    assert r.returncode == 2
    d = make_series({"0001-evil.patch": "--- a/sglang/../../etc/passwd\n+++ b/sglang/../../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n"})
    r = run_cli("check", "--series", str(d), "--json")
    assert r.returncode == 4
    assert "'..'" in r.stderr
    assert json.loads(r.stdout)["error"] == "PatchRefusedError"
    r = run_cli("--help")
    assert r.returncode == 0 and "push" in r.stdout and "check" in r.stdout


def test_base_that_drifted_from_the_pin_is_refused_even_where_every_hunk_applies(two_patch_series, snapshot_root, tmp_path):
    """A pinned file edited OUTSIDE every hunk: the patches still apply, the pin check refuses (exit 3)."""
    series_dir, pristine, _ = two_patch_series
    lines = pristine.splitlines(keepends=True)
    idx = next(i for i, ln in enumerate(lines) if b"class SpeculativeAlgorithm" in ln)
    assert idx > 8  # line 1 is far from hunk 1's context
    lines[0] = lines[0].rstrip(b"\n") + b"  # local edit\n"
    against = tmp_path / "site"
    (against / SPEC).parent.mkdir(parents=True)
    (against / SPEC).write_bytes(b"".join(lines))
    pin = str(series_dir.parent / "pin.toml")
    r = run_cli("check", "--series", str(series_dir), "--against", str(against), "--pin", pin, "--json")
    assert r.returncode == 3, r.stdout + r.stderr
    e = json.loads(r.stdout)
    assert e["error"] == "HashMismatchError" and e["file"] == SPEC
    assert e["expected_sha256"] == sha256_bytes(pristine) and e["actual_sha256"] == sha256_bytes(b"".join(lines))
    with pytest.raises(HashMismatchError):
        build(tmp_path / "out", series_dir=series_dir, base_dir=against, pin=load_pin(series_dir.parent / "pin.toml"))
    assert not (tmp_path / "out").exists()
    # whichever way the drifted hash sorts against the pinned one, it is refused
    want = sha256_bytes(pristine)
    seen = set()
    for n in range(64):
        edited = lines[:]
        edited[0] = lines[0].rstrip(b"\n") + b"  # local edit %d\n" % n
        data = b"".join(edited)
        side = sha256_bytes(data) < want
        if side in seen:
            continue
        seen.add(side)
        (against / SPEC).write_bytes(data)
        with pytest.raises(HashMismatchError):
            build(tmp_path / "out", series_dir=series_dir, base_dir=against, pin=load_pin(series_dir.parent / "pin.toml"))
    assert seen == {True, False}


def test_pin_coverage_is_a_policy_for_every_series_dir(two_patch_series, snapshot_root, tmp_path):
    """Any series (not only the repo's path) must be covered by the pin it is built against; only an
    explicit require_coverage=False (the test overlay) tolerates a lagging pin."""
    from ddtree_deploy.errors import PinError

    series_dir, _, v2 = two_patch_series
    lagging = load_pin(series_dir.parent / "pin.toml")
    del lagging.files["sglang/srt/new_mod.py"]
    lagging.save(tmp_path / "lagging.toml")
    r = run_cli(
        "check", "--series", str(series_dir), "--against", str(snapshot_root), "--pin", str(tmp_path / "lagging.toml"), "--json"
    )
    assert r.returncode == 3 and "sglang/srt/new_mod.py" in r.stderr, r.stderr
    fix = " ".join(r.stderr.split())  # the hint names this series and this pin
    assert f"snapshot pin --series {series_dir.resolve()} --pin {tmp_path / 'lagging.toml'}" in fix, r.stderr
    with pytest.raises(PinError, match="new_mod.py"):
        build(tmp_path / "out", series_dir=series_dir, base_dir=snapshot_root, pin=lagging)
    build(tmp_path / "out", series_dir=series_dir, base_dir=snapshot_root, pin=lagging, require_coverage=False)
    assert (tmp_path / "out" / SPEC).read_bytes() == v2


def test_hunk_header_start_lines_are_checked(snapshot_root, tmp_path, make_series):
    """A hunk whose header names the wrong line (old or new side) is refused, not applied elsewhere."""
    import re

    pristine = (snapshot_root / SPEC).read_bytes()
    lines = pristine.splitlines(keepends=True)
    lines.insert(60, b"# ddtree: hunk two\n")
    lines.insert(20, b"# ddtree: hunk one\n")  # shifts hunk 2's new side by one
    patch = git_diff(pristine, b"".join(lines), SPEC, tmp_path / "d")
    heads = [m for m in re.finditer(rb"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@", patch, re.M)]
    assert len(heads) == 2
    m = heads[1]
    for side, group in (("new", 3), ("old", 1)):
        bad = patch[: m.start(group)] + str(int(m.group(group)) + 1).encode() + patch[m.end(group) :]
        d = make_series({"0001-x.patch": bad}, name=f"sglang-0.5.23-{side}")
        with pytest.raises(PatchApplyError) as ei:
            build(tmp_path / f"out-{side}", series_dir=d, base_dir=snapshot_root, pin=False)
        assert ei.value.hunk == 2 and ei.value.file == SPEC
        if side == "new":
            assert "hunk header says new line" in ei.value.reason
        assert not (tmp_path / f"out-{side}").exists()
    d = make_series({"0001-x.patch": patch}, name="sglang-0.5.23-ok")
    build(tmp_path / "out-ok", series_dir=d, base_dir=snapshot_root, pin=False)
    assert (tmp_path / "out-ok" / SPEC).read_bytes() == b"".join(lines)


def test_bad_input_is_refused_where_it_enters_with_exit_2(tmp_path, make_series, two_patch_series, snapshot_root):
    """Issue 10, item 6: each bad input gets its own clear error and exit 2, not a misleading later one."""
    empty = make_series({"0001-empty.patch": "Just a description.\nNo diff at all.\n"}, name="sglang-0.5.23-empty")
    cases = [
        (["check", "--series", str(empty)], "0001-empty.patch: holds no diff"),
        (["check", "--series", "."], "is not a series directory"),  # run from tmp_path: no series file there
        (["check", "--series", str(tmp_path / "nope")], "--series " + str(tmp_path / "nope") + ": no such directory"),
        (["check", "--against", str(tmp_path / "nope")], "--against " + str(tmp_path / "nope") + ": no such directory"),
        (["check", "--pin", str(tmp_path / "nope.toml")], "--pin " + str(tmp_path / "nope.toml") + ": no such file"),
        (["build", "--pin", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")], ": no such file"),
        (["status", "x", "--inventory", str(tmp_path / "nope.toml")], "not found"),
    ]
    (tmp_path / "a-file").write_text("x")
    cases.append((["build", "--out", str(tmp_path / "a-file" / "out")], f"{tmp_path / 'a-file'} is a file"))
    for args, want in cases:
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "error:" in r.stderr and want in r.stderr and "fix:" in r.stderr, (args, r.stderr)
        assert "a bug" not in r.stderr
    # `--series .` from inside a series dir names the series after that directory (not "")
    series_dir, _, _ = two_patch_series
    r = run_cli(
        "check",
        "--series",
        ".",
        "--against",
        str(snapshot_root),
        "--pin",
        str(series_dir.parent / "pin.toml"),
        "--json",
        cwd=series_dir,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["series"] == "sglang-0.5.23" and json.loads(r.stdout)["series_id"].startswith("sglang-0.5.23+")


def test_compile_error_message_names_file_and_line(tmp_path, make_series, snapshot_root):
    d = make_series(
        {"0001-bad.patch": "--- /dev/null\n+++ b/sglang/srt/bad_mod.py\n@@ -0,0 +1,3 @@\n+X = 1\n+def f(:\n+    pass\n"}
    )
    pin = series_pin(d, snapshot_root)
    for cmd in (["check"], ["build", "--out", str(tmp_path / "out")]):
        r = run_cli(*cmd, "--series", str(d), "--pin", str(pin), "--against", str(snapshot_root))
        assert r.returncode == 5, r.stderr
        assert "error: sglang/srt/bad_mod.py:2: invalid syntax (introduced by 0001-bad.patch)" in r.stderr, r.stderr
    r = run_cli("check", "--series", str(d), "--pin", str(pin), "--against", str(snapshot_root), "--json")
    e = json.loads(r.stdout)
    assert e["error"] == "CompileError" and (e["file"], e["line"], e["patch"]) == ("sglang/srt/bad_mod.py", 2, "0001-bad.patch")
    assert e["message"].startswith("sglang/srt/bad_mod.py:2:")


def test_load_series_of_dot_is_named_after_its_directory(two_patch_series, monkeypatch):
    series_dir, _, _ = two_patch_series
    monkeypatch.chdir(series_dir)
    s = load_series(__import__("pathlib").Path("."))
    assert s.name == "sglang-0.5.23" and s.series_id.startswith("sglang-0.5.23+")


def test_readme_exit_code_table_has_one_row_per_exit_code(repo):
    """Every code the CLI can produce (ExitCode) has exactly one row in the README's table, and no other."""
    import re

    from ddtree_deploy.errors import ExitCode

    text = (repo / "README.md").read_text()
    table = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", table, re.M)]
    assert rows == sorted(rows) and len(rows) == len(set(rows))
    assert set(rows) == {int(c) for c in ExitCode}
