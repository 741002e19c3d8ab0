"""The quickstart's demo (issue 23 items 1 and 6): it needs no torch (``make demo`` installs only the
tool's own dependencies) and runs the side-by-side rollout end to end, production proven untouched,
before the in-place flow. Real sshd on loopback, the real pinned wheel, the repo's series."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deploy_fixtures import needs_sshd

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "transformers", "triton", "numpy", "nvidia")


def test_make_demo_installs_only_the_tools_own_dependencies(tmp_path):
    r = subprocess.run(["make", "-n", "-B", "demo", f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    installs = [ln for ln in r.stdout.splitlines() if "pip install" in ln]
    assert installs, r.stdout
    for line in installs:
        assert "[" not in line.split("pip install", 1)[1], f"the demo installs extras: {line}"
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.split()[0].lower().startswith(HEAVY)], deps


@needs_sshd[0]
@needs_sshd[1]
def test_demo_runs_the_side_by_side_rollout_end_to_end_without_torch():
    """The demo in a process where torch, transformers and numpy cannot be imported at all."""
    block = "import sys\nfor m in " + repr(list(HEAVY[:5])) + ":\n    sys.modules[m] = None\n"
    code = block + "from ddtree_deploy._entry import main\nsys.argv = ['ddtree-deploy', 'demo', '--json']\nmain()\n"
    env = dict(os.environ, PYTHONPATH=str(REPO / "deploy"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1200)
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(p.stdout)
    assert doc["ok"] and doc["message"] == "demo ok"
    steps = doc["steps"]
    ran = [s for s in steps if "argv" in s]
    assert all(s["exit_code"] == s["expected"] for s in ran), ran
    argvs = [" ".join(s["argv"][:3]) for s in ran]
    first_push = next(i for i, a in enumerate(argvs) if a.startswith("push"))
    rollouts = [i for i, a in enumerate(argvs) if a.startswith("rollout demo-ddtree")]
    assert len(rollouts) == 3 and max(rollouts) < first_push  # side by side first: dry run, rollout, remove
    (proof,) = [s for s in steps if s["step"] == "production byte for byte"]
    assert proof["unchanged"] is True and proof["files"] > 4000
    assert "smoke = py_compile only" in p.stderr  # no torch: the host's smoke only compiles
