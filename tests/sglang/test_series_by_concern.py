"""The series is cut by concern, and every patch stands on its own.

- one concern, one place: each file the series touches is touched by exactly one patch (a fix to a
  concern is folded into its patch with ``patches edit`` / ``patches refresh``, not appended as a
  fix-up), and every patch says what it does and why (a message before its diff);
- each patch compiles on its own: ``ddtree-deploy check`` compiles every file as each patch leaves
  it (tests/foundation/test_engine.py proves the check catches an error a later patch repairs);
- each patch leaves SGLang importable: after every patch, every module the series has touched so far
  imports (``_series_prefix_import_harness.py``, on the real pinned package).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang_deps

HERE = Path(__file__).resolve().parent
SERIES = HERE.parent.parent / "patches" / "sglang-0.5.23"


def _series():
    from ddtree_deploy.patches.series import load_series

    return load_series(SERIES)


def test_each_file_belongs_to_one_patch_and_each_patch_says_why():
    owner: dict[str, str] = {}
    for patch in _series().patches:
        for fp in patch.files:
            assert fp.path not in owner, (
                f"{fp.path} is touched by {owner[fp.path]} and {patch.name}: fold the change into "
                f"{owner[fp.path]} (ddtree-deploy patches edit; git commit --fixup; git rebase -i "
                "--autosquash; ddtree-deploy patches refresh)"
            )
            owner[fp.path] = patch.name
        text = (SERIES / patch.name).read_text()
        message = text[: text.index("diff --git")]
        assert len(message.split()) >= 40, f"{patch.name}: its message must say what it does and why"
        assert message.splitlines()[0].strip(), f"{patch.name}: the message starts with its summary line"


# A path of this repository (bench/, tests/, tools/, docs/) or its name: SGLang's code must not
# point a reader at files that exist only here (issue 24). Patch messages may (they are ours).
_REPO_CITATION = re.compile(r"(?<![\w/.])(bench|tests|tools|docs)/[\w.-]+|ddtree-deploy's")


def test_no_code_the_series_adds_cites_a_file_of_this_repository():
    found = []
    for patch in _series().patches:
        text = (SERIES / patch.name).read_text()
        for line in text[text.index("diff --git") :].splitlines():
            if line.startswith("+") and not line.startswith("+++") and _REPO_CITATION.search(line):
                found.append(f"{patch.name}: {line[:120]}")
    assert not found, "\n".join(found)


def test_each_patch_leaves_sglang_importable(tmp_path, snapshot_root):
    site = tmp_path / "site"
    site.mkdir()  # the harness fills it with the pristine package, then each patch's files
    env = dict(os.environ, PYTHONPATH=str(site))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="",
               PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, str(HERE / "_series_prefix_import_harness.py"), str(SERIES), str(snapshot_root),
         str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, f"no report (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1][len("REPORT "):])
    assert [r["patch"] for r in report] == [p.name for p in _series().patches]
    for r in report:
        assert r["modules"], r
        assert not r["errors"], (r["patch"], r["errors"])
    # the last patch's import covers every module the series adds or changes
    assert len(report[-1]["modules"]) == len([p for p in _series().touched_paths() if p.endswith(".py")])
