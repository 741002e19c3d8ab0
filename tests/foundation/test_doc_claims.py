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


# Patch numbers in the docs a user reads (issue 40 item 8: the roadmap cited a patch 0014 after the
# re-cut to 13). A number must be one of the series' patches, and a "NNNN-name" its file name; a
# reference to history says so ("the then patch 0014", a line saying "pre-re-cut"), and the re-cut map's
# "old patch" column is exempt (docs/sglang-integration.md says where each old patch went).
PATCH_REF = re.compile(r"\b(00\d\d)-([a-z][a-z0-9-]*[a-z0-9])|\((00\d\d)\)|\bpatch(?:es)? (00\d\d)(?:-(00\d\d))?")
HISTORICAL = ("pre-re-cut", "before the re-cut")
EXAMPLE_NAMES = {"0014-my-new-patch"}  # docs/patching.md: how to add a new patch


def _doc_patch_refs(text: str):
    """(line number, number, name or None) for each patch reference of a doc's current claims."""
    in_map = False
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("| old patch |"):
            in_map = True
            continue
        in_map = in_map and line.startswith("|")
        if any(h in line for h in HISTORICAL):
            continue
        if in_map:  # only the "now in" column is a current claim
            line = line.split("|")[2] if line.count("|") >= 3 else ""
        for m in PATCH_REF.finditer(line):
            if line[max(0, m.start() - 5) : m.start()].endswith("then "):
                continue
            if m.group(1):
                yield no, m.group(1), f"{m.group(1)}-{m.group(2)}"
            for num in (m.group(3), m.group(4), m.group(5)):
                if num:
                    yield no, num, None


def test_docs_cite_only_patches_that_exist():
    from ddtree_deploy.patches.series import read_series_file
    from ddtree_deploy.paths import default_series_dir

    stems = {name.removesuffix(".patch") for name in read_series_file(default_series_dir())}
    numbers = {s[:4] for s in stems}
    docs = [REPO / "README.md", REPO / "sglang-ddtree-roadmap.md", *sorted((REPO / "docs").glob("*.md"))]
    bad = []
    for doc in docs:
        for no, num, name in _doc_patch_refs(doc.read_text()):
            if name is not None and name not in EXAMPLE_NAMES and not any(s.startswith(name) for s in stems):
                bad.append(f"{doc.relative_to(REPO)}:{no}: {name} is not a patch of the series")
            elif name is None and num not in numbers:
                bad.append(f"{doc.relative_to(REPO)}:{no}: patch {num} does not exist ({len(numbers)} patches)")
    assert not bad, "\n".join(bad)
