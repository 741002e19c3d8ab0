"""CLI conventions (issue 13 item 6): an example in every command's help, one meaning per short flag,
data on stdout, and a confirmation before several hosts go back to pristine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from ddtree_deploy.cli import app

REPO = Path(__file__).resolve().parents[2]


def _leaves(cmd: typer.core.TyperCommand, path: tuple[str, ...] = ()):
    if hasattr(cmd, "commands"):  # a group (typer may vendor its own click: no isinstance)
        for name, sub in cmd.commands.items():
            yield from _leaves(sub, path + (name,))
    else:
        yield path, cmd


def _all_commands():
    return list(_leaves(typer.main.get_command(app)))


def test_the_command_tree_is_the_real_one():
    names = {" ".join(p) for p, _ in _all_commands()}
    assert {"push", "rollback", "bench", "compare", "patches list", "snapshot fetch", "lock release"} <= names
    assert len(names) >= 19


def test_every_command_help_has_an_example():
    runner = CliRunner()
    missing = []
    for path, _ in _all_commands():
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        text = " ".join(res.output.split())
        assert res.exit_code == 0, (path, res.output)
        if "Example: " not in text or "ddtree-deploy " + " ".join(path) not in text.split("Example: ", 1)[1]:
            missing.append(" ".join(path))
    assert not missing, f"no 'Example: ddtree-deploy ...' in the help of: {missing}"


def test_one_meaning_per_short_flag():
    meaning: dict[str, set[str]] = {}
    for path, cmd in _all_commands():
        for p in cmd.params:
            if p.param_type_name == "option":
                longs = [o for o in p.opts + p.secondary_opts if o.startswith("--")]
                for short in (o for o in p.opts if len(o) == 2 and o[0] == "-"):
                    meaning.setdefault(short, set()).add(longs[0] if longs else p.name)
    clashes = {s: sorted(m) for s, m in meaning.items() if len(m) > 1}
    assert not clashes, f"short flags with several meanings: {clashes}"
    assert meaning["-n"] == {"--dry-run"}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "deploy"), str(REPO / "tools"), env.get("PYTHONPATH", "")])
    return env


def test_patches_list_writes_its_data_to_stdout():
    r = subprocess.run([sys.executable, "-m", "ddtree_deploy", "patches", "list"], capture_output=True, text=True,
                       timeout=120, env=_env(), cwd=REPO)
    assert r.returncode == 0, r.stderr
    series = [ln.strip() for ln in (REPO / "patches" / "sglang-0.5.23" / "series").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    rows = [ln.split("\t") for ln in r.stdout.splitlines()]
    assert rows and all(len(row) == 3 for row in rows)
    assert [n for n in dict.fromkeys(row[0] for row in rows)] == series
    assert not any(name in r.stderr for name in series)  # the data is not on stderr


def _two_host_inventory(tmp_path: Path) -> Path:
    key = tmp_path / "id"
    key.write_text("not a key\n")
    lines = []
    for i, name in enumerate(("a", "b")):  # closed loopback ports: a connection attempt fails at once
        lines += [f"[hosts.{name}]", f'target = "root@127.0.0.1:{9 + i}"', f'identity_file = "{key}"',
                  f'known_hosts = "{tmp_path / "kh"}"', 'python = "python3"', f'state_dir = "{tmp_path / name}"', ""]
    inv = tmp_path / "hosts.toml"
    inv.write_text("\n".join(lines))
    return inv


def test_rollback_all_to_pristine_asks_first(tmp_path):
    inv = _two_host_inventory(tmp_path)
    base = [sys.executable, "-m", "ddtree_deploy", "rollback", "--all", "--to", "pristine", "--inventory", str(inv)]
    r = subprocess.run(base, capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr and "fix:" in r.stderr and "--yes" in r.stderr and "2 hosts" in r.stderr
    # with --yes it goes on to the hosts (which are unreachable here): a different outcome than the refusal
    r = subprocess.run(base + ["--yes"], capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path,
                       stdin=subprocess.DEVNULL)
    assert r.returncode not in (0, 2), r.stderr
    assert "--yes" not in r.stderr
