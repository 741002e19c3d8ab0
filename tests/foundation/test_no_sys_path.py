"""No code of the repository edits ``sys.path`` outside a short, explained list.

The packages (``ddtree_deploy``, ``ddtree_offline``) are installed (editable); the tests' helper
modules are on pytest's ``pythonpath`` (pyproject.toml); a child process that needs a directory
gets it through its ``PYTHONPATH``. What may still edit ``sys.path``, and why, is ``ALLOWED`` below.
The scan is textual, so code inside strings (scripts a test hands to a child ``python``) counts too.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("deploy", "tools", "tests", "bench")
SELF = Path(__file__).resolve()

# path (relative to the repo; a trailing "/" means the whole folder) -> why it may edit sys.path
ALLOWED = {
    "deploy/ddtree_deploy/remote/agent.py": "the host-side agent drops '' and '.' so the host's cwd cannot shadow the stdlib",
    "tools/real_pair/run_reference.py": "imports the DDTree reference (liranringel/ddtree) from the checkout --ref "
    "names: its modules (model, ddtree, dflash) are top-level files, not an installable package, and are never copied here",
    "deploy/ddtree_deploy/remote/agent_venv.py": "writes the side-by-side venv's .pth that layers it on production's "
    "site-packages (site.addsitedir, in the venv's interpreter on the host)",
}

EDIT = re.compile(
    r"\bsys\s*\.\s*path\s*\.\s*(insert|append|extend|remove|pop|clear)\s*\("  # sys.path.insert(...)
    r"|\bsys\s*\.\s*path\s*(\[[^\]\n]*\])?\s*\+?=(?!=)"  # sys.path = ..., sys.path[:] = ..., sys.path += ...
    r"|\bsite\s*\.\s*addsitedir\s*\("  # site.addsitedir(...)
    r"|^\s*from\s+sys\s+import\s+[^#\n]*\bpath\b",  # from sys import path (then path.insert(...))
    re.MULTILINE,
)


def _allowed(rel: str) -> bool:
    return any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in ALLOWED)


def sys_path_edits() -> dict[str, list[int]]:
    """{repo-relative path: [line numbers]} of every sys.path edit in the scanned folders."""
    hits: dict[str, list[int]] = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            if path.resolve() == SELF or "__pycache__" in path.parts:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            lines = [text.count("\n", 0, m.start()) + 1 for m in EDIT.finditer(text)]
            if lines:
                hits[path.relative_to(REPO).as_posix()] = lines
    return hits


def test_no_sys_path_edits_outside_the_allowed_files():
    bad = {rel: lines for rel, lines in sys_path_edits().items() if not _allowed(rel)}
    assert not bad, (
        "sys.path edited in "
        + ", ".join(f"{rel}:{lines}" for rel, lines in sorted(bad.items()))
        + ": import the installed package instead, put a tests helper dir on pytest's `pythonpath` "
        "(pyproject.toml), or give a child process a PYTHONPATH"
    )


def test_the_allowed_list_names_only_files_that_still_need_it():
    hits = sys_path_edits()
    for allowed in ALLOWED:
        if allowed.endswith("/"):
            assert (REPO / allowed).is_dir(), f"{allowed}: no such folder; drop it from ALLOWED"
        else:
            assert allowed in hits, f"{allowed} no longer edits sys.path; drop it from ALLOWED"


def test_the_scan_sees_each_form_of_edit():
    """The pattern itself: each way of editing sys.path is seen, reading it is not."""
    edits = [
        "sys.path.insert(0, p)",
        "sys.path.append(p)",
        "sys.path[:] = []",
        "sys.path += [p]",
        "sys.path = [p]",
        "site.addsitedir(p)",
        "from sys import path",
        "    sys.path.pop(0)",
    ]
    reads = ["if p not in sys.path:", "print(sys.path)", "x = sys.path[0]", "sys.path == y", "PYTHONPATH=tools"]
    for line in edits:
        assert EDIT.search(line), line
    for line in reads:
        assert not EDIT.search(line), line
