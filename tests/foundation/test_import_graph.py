"""The package's import graph has no cycles (issue 13).

Built from the source with ``ast`` (nothing is imported, so no import side effects): one node per
module of ``ddtree_deploy``, one edge per ``import``/``from ... import`` that names another module of
the package, at ANY depth (a function-level import is still a dependency: the old
``cli -> deploy_cmds -> remote/demo -> cli`` circle ran through one). ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``. The implicit import of a parent
package's ``__init__`` is not an edge (every submodule would otherwise depend on it).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parents[2] / "deploy" / "ddtree_deploy"
PKG = "ddtree_deploy"


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for p in sorted(PKG_DIR.rglob("*.py")):
        parts = [PKG, *p.relative_to(PKG_DIR).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (p, is_pkg)
    return mods


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, (path, is_pkg) in mods.items():
        package = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    targets.append(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
            for t in targets:
                while t and t not in mods and "." in t:  # import a.b.c where c is an attribute
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None. Iterative DFS (white/grey/black)."""
    colour = {n: 0 for n in graph}
    for root in sorted(graph):
        if colour[root]:
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        colour[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[nxt] == 1:
                return path[path.index(nxt) :] + [nxt]
            elif colour[nxt] == 0:
                colour[nxt] = 1
                stack.append((nxt, iter(sorted(graph[nxt]))))
                path.append(nxt)
    return None


def test_find_cycle_sees_a_cycle_and_its_absence():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_is_the_real_one():
    g = import_graph()
    # edges that exist in the package (a parser that saw nothing would pass the cycle test vacuously)
    assert "ddtree_deploy.patches.engine" in g["ddtree_deploy.build.build"]
    assert "ddtree_deploy.cli.demo" in g["ddtree_deploy.cli.deploy_cmds"]  # a function-level import
    assert "ddtree_deploy.remote.hostops" in g["ddtree_deploy.remote.push"]  # ``from ... import hostops``
    assert sum(len(v) for v in g.values()) > 40


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# --- remote/ draws nothing (issue 13 item 1) -----------------------------------------------------------

REMOTE_DIR = PKG_DIR / "remote"
# agent.py runs on the host: its stdout is the wire (``DDTREE-EVENT``/``DDTREE-RESULT`` lines), not a UI.
WIRE_WRITERS = {"agent.py"}


def ui_uses(path: Path) -> list[str]:
    """Every rich/typer/click import, import of ``ddtree_deploy.cli``, ``print(`` call and
    ``sys.stdout``/``sys.stderr`` use in one file, as ``file:line: what``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        for n in names:
            if n.split(".")[0] in ("rich", "typer", "click") or n.startswith(f"{PKG}.cli"):
                found.append(f"{path.name}:{node.lineno}: import {n}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(f"{path.name}:{node.lineno}: print(")
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("stdout", "stderr")
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            and path.name not in WIRE_WRITERS
        ):
            found.append(f"{path.name}:{node.lineno}: sys.{node.attr}")
    return found


def test_ui_uses_sees_each_kind(tmp_path):
    p = tmp_path / "m.py"
    p.write_text(
        "import sys\nfrom rich.table import Table\nimport ddtree_deploy.cli.console\nprint('x')\n"
        "sys.stderr.write('y')\nS = 'print(1)'\n"
    )
    assert [u.split(": ", 1)[1] for u in ui_uses(p)] == [
        "import rich.table",
        "import ddtree_deploy.cli.console",
        "print(",
        "sys.stderr",
    ]


def test_remote_draws_and_prints_nothing():
    files = sorted(REMOTE_DIR.glob("*.py"))
    assert {"fleet.py", "push.py", "hostops.py", "agent.py"} <= {p.name for p in files}
    found = [u for p in files for u in ui_uses(p)]
    assert not found, "remote/ must report through events and return results, not draw: " + "; ".join(found)
