"""The roadmap's ct129 commands and the shipped inventory use the side-by-side rollout (issue 23):
production is never pushed to, restarted or benchmarked on its port, and every ddtree-deploy
command the section names parses with the real CLI."""

from __future__ import annotations

import re
import shlex

from ddtree_deploy.cli import main
from ddtree_deploy.remote.inventory import load_inventory


def section7(repo) -> str:
    text = (repo / "sglang-ddtree-roadmap.md").read_text()
    return text.split("## 7. Commands for ct129", 1)[1]


def command_lines(text: str) -> list[str]:
    """The shell lines of the section's code blocks, continuation lines joined, comments dropped."""
    lines, out = [], []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        joined = block.replace("\\\n", " ")
        lines += [ln.split("  #", 1)[0].strip() for ln in joined.splitlines() if ln.strip()]
    for ln in lines:
        out.append(re.sub(r"\s+#.*$", "", ln))
    return out


def test_the_ct129_section_rolls_out_side_by_side(repo):
    text = section7(repo)
    cmds = command_lines(text)
    assert any(c.startswith("ddtree-deploy rollout ct129-ddtree") for c in cmds), cmds
    assert not any(re.match(r"ddtree-deploy (push|rollback) ct129\b(?!-)", c) for c in cmds), (
        "production is never patched in place"
    )
    assert not [c for c in cmds if "30000" in c], "no DDTREE server or bench on production's port"
    assert "rollback ct200 --restart" in text and "keeps the patched code" in text  # the rollback section says what to do
    assert "rollout ct129-ddtree --remove" in text


def test_every_ddtree_deploy_command_of_the_section_parses(repo, capsys):
    cmds = [c for c in command_lines(section7(repo)) if c.startswith("ddtree-deploy ")]
    assert len(cmds) >= 10
    for c in cmds:
        argv = shlex.split(c)[1:]
        assert main([*argv, "--help"]) == 0, (c, capsys.readouterr())


def test_the_shipped_inventory_keeps_production_out_of_reach(repo):
    inv = load_inventory(repo / "deploy" / "hosts.toml")
    prod, sbs = inv.hosts["ct129"], inv.hosts["ct129-ddtree"]
    assert prod.restart_command is None, "nothing in the shipped inventory restarts ct129's production service"
    assert "bench" not in prod.raw, "no bench against production"
    assert sbs.is_side_by_side and sbs.production is not None and sbs.production.name == "ct129"
    assert sbs.venv and not sbs.venv.startswith("/opt/sglang/")
    ports = {re.search(r":(\d+)", u).group(1) for u in (prod.health_url, sbs.health_url, sbs.raw["bench"]["base_url"])}  # type: ignore[union-attr]
    assert len(ports) == 3, "production, the side-by-side server and the bench each have their own port"
    for key in ("server_command", "server_command_baseline", "server_command_dflash"):
        assert "/opt/sglang-ddtree/venv/bin/python" in sbs.raw["bench"][key] and "{port}" in sbs.raw["bench"][key]
