"""Mutation testing (cosmic-ray) over the patch engine and the agent's apply/restore path.

``make mutation`` runs this. It copies the repo's tracked files into ``.work/mutation/<name>/`` (the
mutations are written into that copy, never into the checkout), makes one cosmic-ray session per
scope, skips every mutation outside the named functions (``scope.py``), runs the scope's targeted
tests against each mutant with a per-mutant timeout and an overall time bound, and writes
``.work/mutation/report.md``: killed / survived / not run, and every survivor's diff.

Usage: python tests/foundation/mutation/run.py [--minutes N] [--only engine|agent]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent

SCOPES = {
    "engine": {
        "functions": {
            "deploy/ddtree_deploy/patches/engine.py": [
                "apply_file_patch",
                "apply_series",
                "tree_reader",
                "compile_check",
                "_compile_error",
            ],
            "deploy/ddtree_deploy/build/build.py": ["check_pin_coverage", "verify_base_against_pin", "apply_checked"],
        },
        "tests": [
            "tests/foundation/test_engine.py",
            "tests/foundation/test_build_check.py",
            "-k",
            "not edit_refresh and not refresh_refuses and not fetch and not repo_series and not repo_pin "
            "and not bad_input and not compile_error_message",
            "--hypothesis-seed=0",
        ],
        "timeout": 120,
    },
    "agent": {
        "functions": {
            "deploy/ddtree_deploy/remote/agent.py": ["restore_record", "plan_rollback", "write_verified"],
        },
        "tests": [
            "tests/deploy/test_remote_deploy.py",
            "-k",
            "round_trip or broken_backup or edited_on_the_host or smoke_failure or mid_commit or repush "
            "or damaged_during or replaced_by_a_directory or keeps_a_created or already_back",
        ],
        "timeout": 180,
    },
}


def copy_repo(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    dest.mkdir(parents=True, exist_ok=True)
    for rel in filter(None, files):
        src = REPO / rel.decode()
        if src.is_file():
            dst = dest / rel.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
            os.chmod(dst, src.stat().st_mode & 0o777)


def counts(session: Path) -> dict[str, int]:
    con = sqlite3.connect(session)
    try:
        total = con.execute("select count(*) from work_items").fetchone()[0]
        rows = con.execute(
            "select worker_outcome, test_outcome, count(*) from work_results group by worker_outcome, test_outcome"
        ).fetchall()
    finally:
        con.close()
    out = {"total": total, "killed": 0, "survived": 0, "skipped": 0, "other": 0}
    for worker, test, n in rows:
        w, t = str(worker).lower(), str(test).lower()
        if "skipped" in w:
            out["skipped"] += n
        elif "killed" in t or "incompetent" in t:
            out["killed"] += n
        elif "survived" in t:
            out["survived"] += n
        else:
            out["other"] += n
    out["not_run"] = total - sum(out[k] for k in ("killed", "survived", "skipped", "other"))
    return out


def survivors(session: Path) -> list[dict[str, str]]:
    con = sqlite3.connect(session)
    try:
        rows = con.execute(
            "select m.module_path, m.operator_name, m.start_pos_row, r.diff from work_results r "
            "join mutation_specs m on m.job_id = r.job_id where r.test_outcome like '%SURVIVED%' "
            "order by m.module_path, m.start_pos_row"
        ).fetchall()
    finally:
        con.close()
    return [
        {
            "module": str(Path(a).relative_to(Path(a).parents[2])) if len(Path(a).parents) > 2 else a,
            "operator": b,
            "line": c,
            "diff": d or "",
        }
        for a, b, c, d in rows
    ]


def forget_survivors(session: Path) -> int:
    """--resume: survivors are run again (against the tests as they are now)."""
    con = sqlite3.connect(session)
    try:
        n = con.execute("delete from work_results where test_outcome like '%SURVIVED%'").rowcount
        con.commit()
    finally:
        con.close()
    return n


def run_scope(name: str, spec: dict, work: Path, deadline: float, resume: bool = False) -> dict:
    root = work / name
    copy_repo(root)  # also undoes a mutation left in the copy by an interrupted run
    py = sys.executable
    test_cmd = " ".join(
        shlex.quote(x)
        for x in [
            "env",
            f"PYTHONPATH={root / 'deploy'}:{root / 'tools'}",
            f"DDTREE_DEPLOY_REPO={root}",
            py,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            *spec["tests"],
        ]
    )
    cfg = root / f"mutation-{name}.toml"
    mods = ", ".join(json.dumps(str(root / m)) for m in spec["functions"])
    cfg.write_text(
        f"[cosmic-ray]\nmodule-path = [{mods}]\ntimeout = {spec['timeout']}.0\nexcluded-modules = []\n"
        f'test-command = {json.dumps(test_cmd)}\n\n[cosmic-ray.distributor]\nname = "local"\n'
    )
    session = root / f"mutation-{name}.sqlite"
    if resume and session.exists():
        print(f"{name}: resuming; {forget_survivors(session)} survivor(s) will run again", file=sys.stderr)
    else:
        session.unlink(missing_ok=True)
        subprocess.run([py, "-m", "cosmic_ray.cli", "init", str(cfg), str(session)], cwd=root, check=True)
        subprocess.run(
            [py, str(HERE / "scope.py"), str(session)] + [f"{root / m}:{','.join(fs)}" for m, fs in spec["functions"].items()],
            cwd=root,
            check=True,
        )
    left = max(1, int(deadline - time.time()))
    t0 = time.time()
    try:  # the bound: what has not run by the deadline is reported as not run
        subprocess.run([py, "-m", "cosmic_ray.cli", "exec", str(cfg), str(session)], cwd=root, timeout=left)
        bounded = False
    except subprocess.TimeoutExpired:
        bounded = True
    c = counts(session)
    return {
        "scope": name,
        "functions": spec["functions"],
        "counts": c,
        "seconds": round(time.time() - t0),
        "stopped_by_time_bound": bounded,
        "survivors": survivors(session),
        "test_command": test_cmd,
    }


def report(results: list[dict], path: Path) -> str:
    lines = ["# Mutation run (cosmic-ray)", "", f"Machine: {os.uname().nodename}, {os.cpu_count()} CPU(s).", ""]
    lines += ["| scope | functions | in scope | killed | survived | not run | seconds |", "|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["counts"]
        funcs = "; ".join(f"{Path(m).name}: {', '.join(fs)}" for m, fs in r["functions"].items())
        lines.append(
            f"| {r['scope']} | {funcs} | {c['total'] - c['skipped']} | {c['killed']} | {c['survived']} | "
            f"{c['not_run'] + c['other']} | {r['seconds']} |"
        )
    for r in results:
        lines += ["", f"## Survivors: {r['scope']} ({len(r['survivors'])})", ""]
        for s in r["survivors"]:
            lines += [f"- {s['module']}:{s['line']} `{s['operator']}`", "", "```diff", s["diff"].strip(), "```", ""]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60.0, help="overall time bound (default 60)")
    ap.add_argument("--only", choices=sorted(SCOPES), action="append")
    ap.add_argument("--work", type=Path, default=REPO / ".work" / "mutation")
    ap.add_argument(
        "--resume", action="store_true", help="continue an earlier session: run what did not run, and the survivors again"
    )
    a = ap.parse_args()
    deadline = time.time() + a.minutes * 60
    results = []
    for name in a.only or list(SCOPES):
        results.append(run_scope(name, SCOPES[name], a.work, deadline, a.resume))
        (a.work / f"{name}.json").write_text(json.dumps(results[-1], indent=1))
    print(report(results, a.work / ("report.md" if not a.only else f"report-{'-'.join(a.only)}.md")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
