"""Scope a cosmic-ray session to named functions: every mutation outside them is marked SKIPPED.

Usage: python scope.py SESSION.sqlite PATH:func,func [PATH:func ...]
(cosmic-ray mutates whole modules; the issue asks for the patch engine and the agent's apply/restore
path only, so everything else in those modules is skipped before ``cosmic-ray exec``.)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult


def function_lines(path: Path, names: set[str]) -> list[tuple[int, int]]:
    tree = ast.parse(path.read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            found[node.name] = (node.lineno, node.end_lineno)
    missing = names - set(found)
    if missing:
        raise SystemExit(f"error: {path}: no function(s) {', '.join(sorted(missing))}")
    return list(found.values())


def annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where type annotations are: never evaluated under ``from __future__ import annotations``, so a
    mutation there is equivalent (no test can kill it); those are skipped too."""
    spans = []
    for node in ast.walk(ast.parse(path.read_text())):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            anns.append(node.returns)
            a = node.args
            anns += [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None]
        elif isinstance(node, ast.AnnAssign):
            anns.append(node.annotation)
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in anns if n is not None]
    return spans


def main(argv: list[str]) -> int:
    session, specs = argv[0], argv[1:]
    scope: dict[str, list[tuple[int, int]]] = {}
    anns: dict[str, list] = {}
    for spec in specs:
        path, _, funcs = spec.partition(":")
        scope[str(Path(path).resolve())] = function_lines(Path(path), set(funcs.split(",")))
        anns[str(Path(path).resolve())] = annotation_spans(Path(path))

    def in_annotation(m) -> bool:
        pos = tuple(m.start_pos)
        return any(a <= pos < b for a, b in anns.get(str(Path(m.module_path).resolve()), []))

    kept = skipped = 0
    with use_db(session, WorkDB.Mode.open) as db:
        skip = []
        for item in db.work_items:
            inside = all(
                any(a <= m.start_pos[0] <= b for a, b in scope.get(str(Path(m.module_path).resolve()), []))
                and not in_annotation(m)
                for m in item.mutations
            )
            if inside:
                kept += 1
            else:
                skip.append(item.job_id)
        skipped = len(skip)
        db.set_multiple_results(skip, WorkResult(output=None, test_outcome=None, diff=None, worker_outcome=WorkerOutcome.SKIPPED))
    print(f"scope: {kept} mutation(s) in scope, {skipped} skipped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
