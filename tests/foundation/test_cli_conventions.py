"""CLI conventions (issue 13 item 6): an example in every command's help, one meaning per short flag,
data on stdout, and a confirmation before several hosts go back to pristine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
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
    r = subprocess.run(
        [sys.executable, "-m", "ddtree_deploy", "patches", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    series = [
        ln.strip()
        for ln in (REPO / "patches" / "sglang-0.5.23" / "series").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    rows = [ln.split("\t") for ln in r.stdout.splitlines()]
    assert rows and all(len(row) == 3 for row in rows)
    assert [n for n in dict.fromkeys(row[0] for row in rows)] == series
    assert not any(name in r.stderr for name in series)  # the data is not on stderr


def _two_host_inventory(tmp_path: Path) -> Path:
    key = tmp_path / "id"
    key.write_text("not a key\n")
    lines = []
    for i, name in enumerate(("a", "b")):  # closed loopback ports: a connection attempt fails at once
        lines += [
            f"[hosts.{name}]",
            f'target = "root@127.0.0.1:{9 + i}"',
            f'identity_file = "{key}"',
            f'known_hosts = "{tmp_path / "kh"}"',
            'python = "python3"',
            f'state_dir = "{tmp_path / name}"',
            "",
        ]
    inv = tmp_path / "hosts.toml"
    inv.write_text("\n".join(lines))
    return inv


def test_rollback_all_to_pristine_asks_first(tmp_path):
    inv = _two_host_inventory(tmp_path)
    base = [sys.executable, "-m", "ddtree_deploy", "rollback", "--all", "--to", "pristine", "--inventory", str(inv)]
    r = subprocess.run(base, capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr and "fix:" in r.stderr and "--yes" in r.stderr and "2 hosts" in r.stderr
    # with --yes it goes on to the hosts (which are unreachable here): a different outcome than the refusal
    r = subprocess.run(
        base + ["--yes"], capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path, stdin=subprocess.DEVNULL
    )
    assert r.returncode not in (0, 2), r.stderr
    assert "--yes" not in r.stderr


# --- the injected Environment (issue 13 item 3) -----------------------------------------------------------


def _io_env(**kw):
    import io

    from ddtree_deploy.cli.console import Environment

    return Environment(stdin=io.StringIO(), stdout=io.StringIO(), stderr=io.StringIO(), **kw)


def test_commands_write_to_the_injected_environment_not_the_process_streams(capfd):
    from ddtree_deploy.cli import main

    env = _io_env()
    assert main(["patches", "list"], env=env) == 0
    out, err = env.stdout.getvalue(), env.stderr.getvalue()
    rows = [ln.split("\t") for ln in out.splitlines()]
    assert rows and all(len(r) == 3 for r in rows)  # the data, on the env's stdout
    assert "patch(es); one line per patch and file" in err and "\t" not in err  # the message, on its stderr
    real = capfd.readouterr()
    assert real.out == "" and real.err == ""  # nothing reached the process's own streams


def test_errors_go_to_the_environment_in_the_project_style(tmp_path, capfd):
    import json

    from ddtree_deploy.cli import main

    inv = _two_host_inventory(tmp_path)
    env = _io_env()
    assert main(["push", "nosuch", "--inventory", str(inv), "--json"], env=env) == 2
    err = env.stderr.getvalue()
    assert err.startswith("error: no host 'nosuch'") and "\nfix: add a [hosts.nosuch] table" in err
    doc = json.loads(env.stdout.getvalue())
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["error"] == "InventoryError"
    assert capfd.readouterr() == ("", "")


def test_colour_follows_the_environment(monkeypatch, tmp_path):
    from ddtree_deploy.cli import main
    from ddtree_deploy.cli.console import Environment

    inv = _two_host_inventory(tmp_path)
    argv = ["push", "nosuch", "--inventory", str(inv)]
    coloured = _io_env(stderr_isatty=True, colors=True)
    main(argv, env=coloured)
    assert "\x1b[1;31merror:" in coloured.stderr.getvalue()  # a terminal with colour: bold red "error:"
    no_colour = _io_env(stderr_isatty=True, colors=False)  # NO_COLOR: styles stay (bold), colours go
    main(argv, env=no_colour)
    assert "\x1b[1merror:" in no_colour.stderr.getvalue() and "31m" not in no_colour.stderr.getvalue()
    plain = _io_env()  # not a terminal: no escapes at all
    main(argv, env=plain)
    assert "\x1b[" not in plain.stderr.getvalue() and plain.stderr.getvalue().startswith("error: ")
    monkeypatch.setenv("NO_COLOR", "1")
    assert Environment().colors is False
    monkeypatch.delenv("NO_COLOR")
    assert Environment().colors is True


def test_verbosity_reaches_the_environment():
    from ddtree_deploy.cli import main

    env = _io_env()
    main(["-v", "patches", "list"], env=env)
    assert env.verbosity == 1


def test_the_fleet_display_draws_on_the_environment():
    from ddtree_deploy.cli.fleet_ui import FleetUI
    from ddtree_deploy.remote.fleet import DONE, NOTE, FleetEvent

    events = [
        FleetEvent("a", "connecting", 5),
        FleetEvent("a", "uploading", 20),
        FleetEvent("a", "uploading 10/100 bytes", 21),
        FleetEvent("a", "uploading 90/100 bytes", 33),
        FleetEvent("a", "a note", kind=NOTE),
        FleetEvent("a", "deployed", 100, DONE),
    ]
    plain = _io_env()
    with FleetUI(plain, ["a"]) as ui:
        for ev in events:
            ui(ev)
    assert plain.stderr.getvalue().splitlines() == [  # not a terminal: one line per phase, not per tick
        "a: connecting",
        "a: uploading",
        "a: a note",
        "a: deployed",
    ]
    live = _io_env(stderr_isatty=True)
    with FleetUI(live, ["a"]) as ui:
        for ev in events:
            ui(ev)
    text = live.stderr.getvalue()
    assert "\x1b[" in text and "━" in text and "deployed" in text  # a terminal: the live progress bar
    quiet = _io_env(stderr_isatty=True)
    with FleetUI(quiet, ["a"], quiet=True) as ui:
        for ev in events:
            ui(ev)
    assert quiet.stderr.getvalue() == ""


# --- help metavars, usage errors, shell completion (issue 13 item 6) -------------------------------------

import re  # noqa: E402

# What typer prints for a parameter's Python type when no metavar is given.
TYPE_LABEL = re.compile(r"<(?:bool|str|int|float|path|file|directory|int range|float range|list\[[^\]]*\])>")


def _groups_and_leaves(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _groups_and_leaves(sub, path + (name,))


def test_every_value_parameter_has_a_real_metavar():
    missing = []
    for path, cmd in _groups_and_leaves(typer.main.get_command(app)):
        for p in cmd.params:
            if getattr(p, "is_flag", False) or getattr(p, "count", False) or not p.expose_value:
                continue
            if not (p.metavar and re.fullmatch(r"[A-Z][A-Z0-9_.]*", p.metavar)):
                missing.append(f"{' '.join(path) or '(root)'} {p.opts[0]}: {p.metavar!r}")
    assert not missing, missing


def test_help_shows_metavars_not_python_types():
    runner = CliRunner()
    bad = {}
    for path, _ in _groups_and_leaves(typer.main.get_command(app)):
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert res.exit_code == 0, (path, res.output)
        found = TYPE_LABEL.findall(res.output)
        if found:
            bad[" ".join(path) or "(root)"] = sorted(set(found))
    assert not bad, f"python types shown in help: {bad}"
    text = runner.invoke(app, ["push", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}).output
    assert "Usage: ddtree-deploy push [OPTIONS] [HOST]..." in text
    assert re.search(r"--build\s+-b\s+DIR\s", text) and re.search(r"--inventory\s+-i\s+FILE\s", text)
    assert re.search(r"--dry-run\s+-n\s+Preflight", text)  # a flag: no value shown at all
    bench = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}).output
    assert re.search(r"--budgets\s+BUDGETS\s", bench) and re.search(r"--dataset\s+-d\s+DATASET\s", bench)


def test_type_label_sees_what_typer_prints_by_default():
    assert TYPE_LABEL.findall("--all  <bool>  x  hosts... <list[str]> --out <path> -n <int range> [x>=0]") == [
        "<bool>",
        "<list[str]>",
        "<path>",
        "<int range>",
    ]
    assert not TYPE_LABEL.findall("bench-out/<host>-<UTC time>")  # help prose may hold angle brackets


USAGE_ERRORS = [
    (["history"], "history: Missing argument 'HOST'", "usage: ddtree-deploy history [OPTIONS] {HOST}"),
    (["push", "--frobnicate"], "push: No such option: --frobnicate", "usage: ddtree-deploy push [OPTIONS] [HOST]..."),
    (["bench", "gpu1", "--concurrency", "many"], "bench: Invalid value for '--concurrency'", "usage: ddtree-deploy bench"),
    (["pusj"], "No such command 'pusj'", "usage: ddtree-deploy [OPTIONS] COMMAND [ARGS]..."),
    (["lock", "grab"], "lock: No such command 'grab'", "see `ddtree-deploy lock --help`"),
]


@pytest.mark.parametrize("argv,message,fix", USAGE_ERRORS, ids=[" ".join(a) for a, _, _ in USAGE_ERRORS])
def test_usage_errors_in_the_project_style_with_exit_2(argv, message, fix):
    import json

    from ddtree_deploy.cli import main

    env = _io_env()
    assert main(argv, env=env) == 2
    err = env.stderr.getvalue()
    assert err.startswith(f"error: {message}"), err
    assert "\nfix: " in err and fix in err.split("\nfix: ", 1)[1], err
    assert "Usage:" not in err and "Try '" not in err and "Error:" not in err  # not click's own layout
    assert env.stdout.getvalue() == ""
    env = _io_env()
    assert main([*argv, "--json"], env=env) == 2
    doc = json.loads(env.stdout.getvalue())
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["error"] == "UsageError" and message in doc["message"]


def test_usage_error_from_the_console_script():
    r = subprocess.run(
        [sys.executable, "-m", "ddtree_deploy", "rollback", "--to"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=REPO,
    )
    assert r.returncode == 2
    assert r.stderr.startswith("error: rollback: Option '--to' requires an argument"), r.stderr
    assert "fix: usage: ddtree-deploy rollback [OPTIONS] [HOST]..." in r.stderr


def test_shell_completion_shows_installs_and_completes(tmp_path):
    env = {**_env(), "HOME": str(tmp_path), "SHELL": "/bin/bash"}
    cmd = f"{sys.executable} -m ddtree_deploy"
    r = subprocess.run(["bash", "-c", f"{cmd} --show-completion"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "_DDTREE_DEPLOY_COMPLETE=complete_bash" in r.stdout and "complete -o default -F" in r.stdout
    r = subprocess.run(
        ["bash", "-c", f"{cmd} --install-completion"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    assert r.returncode == 0, r.stderr
    assert "_DDTREE_DEPLOY_COMPLETE" in (tmp_path / ".bash_completions" / "ddtree-deploy.sh").read_text()
    assert ".bash_completions/ddtree-deploy.sh" in (tmp_path / ".bashrc").read_text()
    for words, cword, want in (
        ("ddtree-deploy pu", "1", {"push"}),
        ("ddtree-deploy lock ", "2", {"status", "release"}),
        ("ddtree-deploy push --dr", "2", {"--dry-run"}),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "ddtree_deploy"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "_DDTREE_DEPLOY_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": cword},
            cwd=REPO,
        )
        assert set(r.stdout.split()) == want, (words, r.stdout, r.stderr)


@pytest.mark.parametrize("answer", ["n\n", "", "yes please\n"])
def test_rollback_to_pristine_question_is_asked_on_the_environment_and_no_means_no(tmp_path, answer):
    import io

    from ddtree_deploy.cli import main

    inv = _two_host_inventory(tmp_path)
    env = _io_env(stdin_isatty=True)
    env.stdin = io.StringIO(answer)
    assert main(["rollback", "--all", "--to", "pristine", "--inventory", str(inv)], env=env) == 2
    err = env.stderr.getvalue()
    assert err.startswith("roll 2 hosts (a, b) back to pristine, undoing every deploy on each? [y/N]: ")
    assert "error: rollback cancelled; nothing was changed" in err and "connecting" not in err


def test_rollback_to_pristine_goes_on_after_yes(tmp_path):
    import io

    from ddtree_deploy.cli import main

    inv = _two_host_inventory(tmp_path)
    env = _io_env(stdin_isatty=True)
    env.stdin = io.StringIO("y\n")
    code = main(["rollback", "--all", "--to", "pristine", "--inventory", str(inv)], env=env)
    err = env.stderr.getvalue()
    assert code not in (0, 2), err  # it went on to the hosts (closed loopback ports: unreachable)
    assert "[y/N]: " in err and "cancelled" not in err and "a: connecting" in err
