"""SGLang's formatting and lint on the DDTree series (``make lint`` runs it).

Builds the patched tree (``overlay.patched_site()``: the pinned package with the series applied, cached)
and checks, with SGLang's own tools and settings:

- **black** (SGLang's formatter, default settings: line length 88) over every file the series adds and
  every changed file whose pristine version is black-clean (checked here each time), so a failure in
  a changed file is in the series' hunks. Some changed files (11 of 23 today) are not black-clean upstream;
  they are named in one note and skipped instead of blaming the series for upstream's lines.
- **isort** (``--profile black``, ``sglang`` first party) over the files the series adds. Not over the
  files it changes: pristine SGLang 0.5.23 is not isort-clean under any settings this could reproduce
  (its multi-line imports keep their magic trailing commas), so the series' hunks there follow the
  surrounding imports instead.
- **ruff**'s pyflakes rules (``F``: unused imports and names, undefined names) over the files the series
  adds.

Exit 0 when clean; 1 with each finding on stderr and the command that fixes it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

BLACK = ["black", "--check", "--quiet"]
ISORT = ["isort", "--profile", "black", "-p", "sglang", "--check-only", "--quiet"]
RUFF = ["ruff", "check", "--isolated", "--select", "F", "--quiet"]


def _tool(venv_bin: Path, argv: list[str]) -> list[str]:
    exe = venv_bin / argv[0]
    return [str(exe) if exe.exists() else argv[0], *argv[1:]]


def _run(cmd: list[str], cwd: Path, files: list[str]) -> bool:
    """True when ``cmd`` accepts ``files``; a tool that fails to run at all (usage error, crash) raises."""
    try:
        proc = subprocess.run([*cmd, *files], cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit(f"{cmd[0]} is not installed; fix: make venv (the test extra pins black and isort)") from None
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed to run (rc={proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc.returncode == 0


def _failing(cmd: list[str], cwd: Path, files: list[str]) -> list[str]:
    """The files ``cmd`` rejects: one run over all of them, then file by file to name the culprits."""
    if not files or _run(cmd, cwd, files):
        return []
    return [rel for rel in files if not _run(cmd, cwd, [rel])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=Path, default=None, help="series dir (default: the pinned version's)")
    args = ap.parse_args(argv)
    from ddtree_deploy.build import overlay
    from ddtree_deploy.build.build import resolve_inputs
    from ddtree_deploy.pin import snapshot

    inputs = resolve_inputs(args.series)
    pristine = inputs.base_dir or snapshot.ensure_snapshot(inputs.pin)
    site = overlay.patched_site(args.series)
    py = sorted(p for p in inputs.series.touched_paths() if p.endswith(".py"))
    added = [p for p in py if not (pristine / p).is_file()]
    changed = [p for p in py if p not in added]
    venv_bin = Path(sys.executable).parent

    findings: list[str] = []
    upstream_unclean = set(_failing(_tool(venv_bin, BLACK), pristine, changed))
    if upstream_unclean:
        names = ", ".join(sorted(upstream_unclean))
        print(f"note: not black-clean upstream, so not checked with black: {names}", file=sys.stderr)
    for rel in _failing(_tool(venv_bin, BLACK), site, [p for p in py if p not in upstream_unclean]):
        findings.append(f"black: {rel} would be reformatted")
    for rel in _failing(_tool(venv_bin, ISORT), site, added):
        findings.append(f"isort: {rel} imports are not sorted (--profile black, sglang first party)")
    for rel in _failing(_tool(venv_bin, RUFF), site, added):
        findings.append(f"ruff (pyflakes): {rel} has findings")
    if findings:
        for f in findings:
            print(f, file=sys.stderr)
        print(
            "fix: ddtree-deploy patches edit; in .work/sglang run black (and isort --profile black -p sglang, "
            "ruff check --select F --fix on new files) over the files above; git commit --fixup=<the owning "
            "patch's commit>; git rebase -i --autosquash <pristine>; ddtree-deploy patches refresh",
            file=sys.stderr,
        )
        return 1
    print(
        f"series lint: {len(py) - len(upstream_unclean)} of {len(py)} files black-clean ({len(added)} added, "
        f"{len(changed)} changed; {len(upstream_unclean)} skipped, upstream not black-clean); "
        "added files isort- and pyflakes-clean",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
