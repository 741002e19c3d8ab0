"""Every relative link in the README and docs/ points at a file (or folder) that exists.

Links are Markdown's inline ``[text](target)`` and ``![alt](target)``; a ``#fragment`` is cut off
(the file must exist; a bare ``#anchor`` names the page itself); URLs with a scheme are not checked.
Link syntax inside fenced code blocks and inline code spans is not a link.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[(?:[^\]\n]|\][^(\n])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    text = FENCE.sub("", text)
    # Inline code is no link, but a code span *as the link text* ([`x.md`](x.md)) is: blank the span only.
    text = CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), text)
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target)
    return out


def broken_links() -> list[str]:
    bad = []
    for page in pages():
        for target in relative_links(page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                bad.append(f"{page.relative_to(REPO)}: ({target})")
    return bad


def test_every_relative_link_in_the_readme_and_docs_resolves():
    assert (REPO / "docs").is_dir()
    assert not broken_links(), "links to nothing:\n" + "\n".join(broken_links())


def test_the_readme_links_each_moved_doc():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for doc in ("docs/deploy.md", "docs/patching.md", "docs/ddtree-core.md", "docs/measuring.md"):
        assert doc in relative_links(text), f"the README does not link {doc}"


def test_the_link_pattern():
    text = (
        "[a](x.md) ![img](d/p.png) [`code`](y.md#part) [web](https://e.org/z) [self](#anchor)\n"
        '`[not](inline.md)`\n```\n[not](fenced.md)\n```\n[t](<spaced.md> "title")'
    )
    assert relative_links(text) == ["x.md", "d/p.png", "y.md#part", "spaced.md"]


def test_the_readme_commands_table_names_every_command():
    """Each command (and sub-command) the CLI has is a row of the README's commands table."""
    import typer

    from ddtree_deploy.cli import app

    def leaves(cmd, prefix: str) -> list[str]:  # typer's own (vendored) click Group: duck-typed
        subs = getattr(cmd, "commands", None)
        if subs:
            return [n for name, sub in subs.items() for n in leaves(sub, f"{prefix} {name}".strip())]
        return [prefix]

    every = leaves(typer.main.get_command(app), "")
    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    covered = set()
    for m in re.finditer(r"^\| `ddtree-deploy ([^`]*)`", table, re.M):
        words = m.group(1).replace("\\|", "|").split()  # "lock status|release HOST..." names two
        covered.add(words[0])
        if len(words) > 1:
            covered.update(f"{words[0]} {sub}" for sub in words[1].split("|"))
    assert len(every) >= 10, every
    missing = [c for c in every if c not in covered]
    assert not missing, f"commands without a row in the README's commands table: {missing}"
