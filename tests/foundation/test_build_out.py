"""``build --out`` never destroys what it did not make, and every command that writes has --dry-run
(issue 23 item 4). The builds here are of the repo's series on the pinned snapshot (the real CLI)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer
from testkit import run_cli

from ddtree_deploy.cli import app


def listing(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def project(tmp_path):
    """A folder with someone's files in it (what `build --out .` used to delete)."""
    d = tmp_path / "project"
    (d / "src").mkdir(parents=True)
    (d / "src" / "main.py").write_text("print('mine')\n")
    (d / "notes.txt").write_text("do not lose me\n")
    return d


def test_out_refuses_anything_that_is_not_a_previous_build(tmp_path, project, snapshot_root):
    system_file = tmp_path / "etc-hosts"
    system_file.write_text("127.0.0.1 localhost\n")
    cases = [
        (project, ".", "refusing to replace the current directory", "--out build/"),  # never, not even with --force
        (tmp_path, str(project), "is a directory that holds no previous build", "--force"),
        (tmp_path, str(system_file), "is a file", "--force"),
    ]
    for cwd, out, want, fix in cases:
        before_project, before_file = listing(project), system_file.read_bytes()
        r = run_cli("build", "--out", out, "--json", cwd=cwd)
        assert r.returncode == 2, (out, r.stderr)
        assert want in r.stderr and "\nfix: " in r.stderr and fix in r.stderr.split("\nfix: ", 1)[1], r.stderr
        doc = json.loads(r.stdout)
        assert doc["error"] == "UsageError" and doc["exit_code"] == 2 and fix in doc["hint"]
        assert listing(project) == before_project and system_file.read_bytes() == before_file
        assert "a bug" not in r.stderr


def test_out_replaces_a_previous_build_or_an_empty_directory_and_force_replaces_the_rest(tmp_path, project, snapshot_root):
    out = tmp_path / "b"
    r = run_cli("build", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first = listing(out)
    (out / "stale-file").write_text("left from an older build\n")
    r = run_cli("build", "--out", str(out), cwd=tmp_path)  # a previous build: replaced whole
    assert r.returncode == 0, r.stderr
    assert listing(out) == first
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli("build", "--out", str(empty), cwd=tmp_path).returncode == 0
    assert (empty / "manifest.json").is_file()
    r = run_cli("build", "--out", str(project), "--force", cwd=tmp_path)  # asked for: replaced
    assert r.returncode == 0, r.stderr
    assert not (project / "notes.txt").exists() and (project / "manifest.json").is_file()


def test_force_never_replaces_the_current_directory(tmp_path, project):
    before = listing(project)
    for out in (".", str(project), str(project.parent)):
        r = run_cli("build", "--out", out, "--force", cwd=project)
        assert r.returncode == 2 and "current directory" in r.stderr and "fix:" in r.stderr, r.stderr
    assert listing(project) == before


def test_a_manifest_json_that_is_not_ours_is_not_a_previous_build(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "manifest.json").write_text('{"name": "someone else\'s web app"}\n')
    (d / "index.html").write_text("<html></html>\n")
    r = run_cli("build", "--out", str(d), cwd=tmp_path)
    assert r.returncode == 2 and "no valid manifest.json" in r.stderr
    assert (d / "index.html").is_file()


def test_build_dry_run_writes_nothing(tmp_path, snapshot_root):
    out = tmp_path / "new"
    r = run_cli("build", "--out", str(out), "--dry-run", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dry_run"] is True and doc["out_action"] == "new" and len(doc["files"]) > 10
    assert "wrote nothing" in doc["message"] and not out.exists()
    assert os.listdir(tmp_path) == []


# Commands that write nothing outside a temp dir they remove (demo), or nothing at all. Every other
# command writes (a file, the cache, a host) and must offer --dry-run.
READ_ONLY = {
    "check",
    "compare",
    "demo",
    "history",
    "lock status",
    "patches list",
    "smoke",
    "snapshot path",
    "snapshot verify",
    "status",
}


def _leaves(cmd, path=()):
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _leaves(sub, path + (name,))
    else:
        yield " ".join(path), cmd


def test_every_command_that_writes_has_dry_run():
    commands = dict(_leaves(typer.main.get_command(app)))
    assert READ_ONLY <= set(commands), READ_ONLY - set(commands)
    missing = []
    for name, cmd in commands.items():
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if name not in READ_ONLY and "--dry-run" not in opts:
            missing.append(name)
        if "--dry-run" in opts:
            assert "-n" in opts, f"{name}: --dry-run without its short flag -n"
    assert not missing, f"commands that write but have no --dry-run: {missing}"
    assert {"build", "push", "rollback", "rollout", "bench", "snapshot fetch", "snapshot pin", "patches edit"} <= {
        n for n, c in commands.items() if "--dry-run" in {o for p in c.params for o in getattr(p, "opts", [])}
    }
