"""Docs that cannot drift (issue 24 item 6): the claims of the README and the docs that a program can
check, checked against the code they describe.

- the README's exit-code table lists exactly the codes of ``ExitCode``;
- "anything that writes has ``--dry-run``": every command has ``--dry-run`` or is named below as one that
  writes nothing, with its reason (a new command must take one side);
- the roadmap's knobs table and docs/ddtree-core.md's flag table name exactly the ``--speculative-ddtree-*``
  flags the series adds to SGLang's server args (read from the built tree);
- docs/ddtree-core.md's environment-knob table names exactly the ``SGLANG_DDTREE_*`` variables the built
  tree reads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from ddtree_deploy.cli import app
from ddtree_deploy.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]

# Commands without --dry-run, and why they write nothing a user keeps.
WRITES_NOTHING = {
    "check": "applies the series in memory and compiles; writes nothing",
    "smoke": "imports the deployed tree on the host; reads only",
    "status": "reads the host's files and state",
    "history": "reads the host's state directory",
    "demo": "works only in a throwaway temporary directory and loopback host it removes",
    "compare": "reads two result files",
    "snapshot verify": "re-hashes the cached snapshot",
    "snapshot path": "prints the snapshot's path",
    "patches list": "prints the series",
    "lock status": "reads the host's lock",
}


def _leaves(cmd, path: tuple[str, ...] = ()):
    if hasattr(cmd, "commands"):  # typer's (vendored) click Group: duck-typed
        for name, sub in cmd.commands.items():
            yield from _leaves(sub, path + (name,))
    else:
        yield " ".join(path), cmd


def _md_table(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_the_readme_exit_code_table_is_exitcode():
    table = _md_table((REPO / "README.md").read_text(encoding="utf-8"), "## Exit codes")
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == {int(c) for c in ExitCode}, documented ^ {int(c) for c in ExitCode}


def test_every_command_that_writes_has_dry_run():
    commands = dict(_leaves(typer.main.get_command(app)))
    without = {name for name, cmd in commands.items() if "--dry-run" not in {o for p in cmd.params for o in p.opts}}
    assert without - set(WRITES_NOTHING) == set(), "commands without --dry-run not known to write nothing"
    assert set(WRITES_NOTHING) - set(commands) == set(), "WRITES_NOTHING names commands the CLI no longer has"
    assert set(WRITES_NOTHING) & (set(commands) - without) == set(), "has --dry-run now: drop it from WRITES_NOTHING"
    assert "--dry-run" in (REPO / "README.md").read_text(encoding="utf-8")  # the claim this test backs


@pytest.fixture(scope="module")
def built_tree() -> Path:
    from ddtree_deploy.build import overlay

    return overlay.patched_site() / "sglang"


def _flags(text: str) -> set[str]:
    """``--speculative-ddtree-*`` flags named in ``text`` (``--no-X`` counts as ``X``)."""
    return {"--" + f for f in re.findall(r"--(?:no-)?(speculative-ddtree-[a-z-]+[a-z])", text)}


def test_the_flag_tables_name_the_series_server_args(built_tree):
    fields = set(
        re.findall(
            r"^\s+(speculative_ddtree_[a-z_]+): A\[",
            (built_tree / "srt/arg_groups/fields/spec.py").read_text(encoding="utf-8"),
            re.M,
        )
    )
    code = {"--" + f.replace("_", "-") for f in fields}
    assert len(code) >= 5, code
    roadmap = (REPO / "sglang-ddtree-roadmap.md").read_text(encoding="utf-8")
    knobs = _md_table(roadmap, "## 2. Knobs").split("\n### ", 1)[0]
    assert _flags(knobs) == code, ("roadmap knobs table", _flags(knobs) ^ code)
    core = _md_table((REPO / "docs/ddtree-core.md").read_text(encoding="utf-8"), "## Flags")
    assert _flags(core) == code, ("docs/ddtree-core.md flags", _flags(core) ^ code)


def test_the_env_knob_table_names_what_the_tree_reads(built_tree):
    code = set()
    for f in (built_tree / "srt").rglob("*.py"):
        code |= set(re.findall(r"SGLANG_DDTREE_[A-Z0-9_]*[A-Z0-9]", f.read_text(encoding="utf-8", errors="replace")))
    table = _md_table((REPO / "docs/ddtree-core.md").read_text(encoding="utf-8"), "## Environment knobs")
    documented = set(re.findall(r"^\| `(SGLANG_DDTREE_[A-Z0-9_]+)` \|", table, re.M))
    assert code and documented == code, ("env knobs", documented ^ code)
