"""The push's two long procedures stay a list of named steps (issue 13 item 4).

``agent.op_apply`` (the journaled apply on the host) and ``hostops.preflight`` (every check before
a write) read as one call per step; the steps themselves are tested through the real sshd hosts in
test_remote_deploy.py. This only keeps the two from growing back into one deep block.
"""

from __future__ import annotations

import ast
from pathlib import Path

REMOTE = Path(__file__).resolve().parents[2] / "deploy" / "ddtree_deploy" / "remote"
BLOCKS = (ast.If, ast.For, ast.While, ast.Try, ast.With)


def function(path: Path, name: str) -> ast.FunctionDef:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{path.name}: no function {name}")


def depth(node: ast.AST) -> int:
    """How deep the control-flow blocks nest inside ``node`` (a flat body is 0)."""
    inner = [depth(c) for c in ast.iter_child_nodes(node)]
    return (1 if isinstance(node, BLOCKS) else 0) + max(inner, default=0)


def shape(path: Path, name: str) -> tuple[int, int, list[str]]:
    fn = function(path, name)
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))  # source order (ast.walk is breadth first)
    names = [n.func.id for n in calls]  # type: ignore[attr-defined]
    return fn.end_lineno - fn.lineno + 1, max(depth(s) for s in body), names  # type: ignore[operator]


def test_shape_measures_what_it_says(tmp_path):
    p = tmp_path / "m.py"
    p.write_text(
        "def f(x):\n    '''doc'''\n    try:\n        for i in x:\n            if i:\n                g(i)\n"
        "    finally:\n        h()\n"
    )
    assert shape(p, "f") == (8, 3, ["g", "h"])


def test_op_apply_is_a_list_of_named_steps():
    lines, deep, calls = shape(REMOTE / "agent.py", "op_apply")
    assert lines <= 45 and deep <= 2, (lines, deep)
    steps = [
        "receive_payload",
        "acquire_lock",
        "recheck_under_lock",
        "write_draft_record",
        "back_up_files",
        "stage_files",
        "commit_files",
        "verify_in_place",
        "smoke_in_place",
        "record_deployed",
        "apply_failed",
        "release_lock",
    ]
    assert [c for c in calls if c in steps] == steps  # each step once, in this order


def test_preflight_is_a_list_of_named_checks():
    lines, deep, calls = shape(REMOTE / "hostops.py", "preflight")
    assert lines <= 30 and deep <= 1, (lines, deep)
    checks = [
        "probe",
        "require_pinned_version",
        "require_import_from_site",
        "require_python",
        "require_state_outside_site",
        "plan_files",
        "refuse_if_locked",
        "refuse_if_needs_human",
        "refuse_if_interrupted",
        "check_disk",
    ]
    assert [c for c in calls if c in checks] == checks
