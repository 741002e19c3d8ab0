#!/usr/bin/env python
"""Benchmark `ddtree-deploy push` against loopback sshd hosts, and raw `scp` of the same files.

    .venv/bin/python tools/bench/bench_push.py [--hosts 1,2,4,8] [--repeat 3] [--build DIR] [--out out/bench_push.md]

One run: builds the repo's series (or takes --build), starts max(--hosts) throwaway sshd hosts
(ddtree_deploy.testing_sshd), each with the pinned wheel's srt/speculative files and every file
the build touches, then for each N pushes to N hosts in parallel (fresh,
pristine hosts every repeat; the median is reported), re-pushes (must send 0 file bytes), and times
`scp` of the same files to 1 and to max(N) hosts (OpenSSH's default SFTP mode, and `scp -O`, the
legacy protocol that, like push, runs a command through the remote login shell). The smoke step is
py_compile only (no module imports), so the numbers compare transport + verification, not SGLang's
import time. Targets: 8 hosts <= 1.5x one host; re-push sends 0 bytes; push within 2x of raw scp.
Prints the table and writes it as markdown.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from ddtree_deploy.remote.fleet import run_fleet
from ddtree_deploy.remote.hostops import load_build
from ddtree_deploy.remote.inventory import load_inventory
from ddtree_deploy.remote.push import PushOptions, push_pipeline
from ddtree_deploy.testing_sshd import FakeHost, sshd_available, unpack_wheel, write_inventory

REPO = Path(__file__).resolve().parents[2]

PREFIX = "sglang/srt/speculative/"
DFLASH_LIKE = ["spec_info.py", "dflash_worker_v2.py", "dflash_info.py", "dflash_info_v2.py", "spec_utils.py"]


def wheel() -> Path:
    env = os.environ.get("DDTREE_DEPLOY_TEST_WHEEL")
    if env:
        return Path(env)
    from ddtree_deploy.pin import snapshot

    return snapshot.wheel_path()


def synthetic_build(out: Path, site: Path) -> Path:
    """The files a DDTree series touches in srt/speculative (each pristine file + a few lines)."""
    files = []
    for n in DFLASH_LIKE:
        rel = PREFIX + n
        base = (site / rel).read_bytes()
        new = base + b"\n\ndef ddtree_bench_marker():\n    return 1\n"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(new)
        files.append(
            {
                "path": rel,
                "action": "modify",
                "pristine_sha256": hashlib.sha256(base).hexdigest(),
                "patched_sha256": hashlib.sha256(new).hexdigest(),
                "mode": "0644",
                "patches": [],
            }
        )
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "format": 1,
                "package": "sglang",
                "version": "0.5.23",
                "series": "sglang-0.5.23",
                "series_id": "sglang-0.5.23+bench",
                "patches": [],
                "files": files,
            }
        )
    )
    return out


def reset(h: FakeHost, site: Path) -> None:
    shutil.rmtree(h.state_dir, ignore_errors=True)
    dst = h.site / "sglang"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(site / "sglang", dst)


def timed(fn) -> float:
    os.sync()  # do not bill the setup's dirty pages to the first fsync of the measured push
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--build",
        type=Path,
        default=None,
        help="A build dir (default: build the repo's series; if it does not build, a DFlash-like synthetic build).",
    )
    ap.add_argument("--out", type=Path, default=REPO / "out" / "bench_push.md")
    args = ap.parse_args()
    why = sshd_available()
    if why:
        print(f"bench_push: {why}", file=sys.stderr)
        return 2
    counts = [int(x) for x in args.hosts.split(",")]
    nmax = max(counts)
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-bench-push-"))
    hosts: list[FakeHost] = []
    try:
        site = tmp / "pristine"
        touched = set()
        if args.build is None:  # the repo's series, if it builds; else a DFlash-like synthetic build
            try:
                from ddtree_deploy.build.build import build

                build(tmp / "series-build")
                args.build = tmp / "series-build"
            except Exception as exc:  # noqa: BLE001
                print(f"bench_push: the series does not build ({exc}); using a synthetic build", file=sys.stderr)
        if args.build:
            touched = {f["path"] for f in json.loads((args.build / "manifest.json").read_text())["files"]}
        with zipfile.ZipFile(wheel()) as z:
            members = [
                n for n in z.namelist() if (n.startswith(PREFIX) and n.count("/") == 3 and n.endswith(".py")) or n in touched
            ]
        unpack_wheel(wheel(), site, members)
        build_dir = args.build or synthetic_build(tmp / "build", site)
        bs = load_build(build_dir)
        payload = [build_dir / f.path for f in bs.files if f.action != "delete"]
        nbytes = sum(p.stat().st_size for p in payload)
        for i in range(nmax):
            h = FakeHost.create(tmp / f"h{i}", 60 + i, f"bench{i}")
            shutil.copytree(site, h.site, dirs_exist_ok=True)
            h.start()
            h.trust()
            hosts.append(h)
        inv_path = write_inventory(
            tmp / "hosts.toml",
            {h.name: h.inventory_table(site_packages=str(h.site), smoke_modules=[], smoke_run=[]) for h in hosts},
        )
        inv = load_inventory(inv_path)
        all_cfg = list(inv.hosts.values())
        pipeline = push_pipeline(bs, PushOptions())

        def push(n: int):
            rs = run_fleet(all_cfg[:n], pipeline, title="bench")
            bad = [r for r in rs if not r.ok]
            if bad:
                raise SystemExit(f"push failed: {bad[0].message}")
            return rs

        for h in hosts:  # warm up (page cache, sshd)
            reset(h, site)
        push(1)
        os.sync()
        rows: dict[str, float] = {}
        cpu: dict[int, tuple[float, float]] = {}
        for n in counts:
            ts = []
            for _ in range(args.repeat):
                for h in hosts[:n]:
                    reset(h, site)
                ts.append(timed(lambda: push(n)))
            rows[f"push {n}"] = statistics.median(ts)
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            for h in hosts[:n]:
                reset(h, site)
            os.sync()
            t0 = time.perf_counter()
            push(n)
            wall = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu[n] = (ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime, wall)
            print(f"push to {n} host(s): {rows[f'push {n}']:.3f}s  (runs: {', '.join(f'{t:.3f}' for t in ts)})", flush=True)
        # re-push: everything already patched
        ts, sent, wire = [], [], []
        for _ in range(args.repeat):
            os.sync()
            t0 = time.perf_counter()
            rs = push(1)
            ts.append(time.perf_counter() - t0)
            sent.append(rs[0].bytes_sent)
            wire.append(rs[0].data.get("wire_bytes", 0))
            assert rs[0].status == "unchanged", rs[0].status
        rows["re-push 1"] = statistics.median(ts)
        repush_bytes = max(sent)
        repush_wire = max(wire)
        print(
            f"re-push (unchanged): {rows['re-push 1']:.3f}s, file bytes sent {repush_bytes}, "
            f"protocol bytes {repush_wire} (agent source + request)",
            flush=True,
        )

        def scp(n: int, legacy: bool) -> None:
            procs = []
            for h in hosts[:n]:
                dst = h.root / "scp-dst"
                dst.mkdir(exist_ok=True)
                cmd = [
                    "scp",
                    "-q",
                    "-B",
                    *(["-O"] if legacy else []),
                    "-i",
                    str(h.client_key),
                    "-o",
                    f"UserKnownHostsFile={h.known_hosts}",
                    "-o",
                    "StrictHostKeyChecking=yes",
                    "-P",
                    str(h.port),
                    *map(str, payload),
                    f"root@{h.addr}:{dst}/",
                ]
                procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
            for p in procs:
                if p.wait(timeout=120) != 0:
                    raise SystemExit("scp failed")

        for n in sorted({1, nmax}):
            for legacy in (False, True):
                key = f"scp{' -O' if legacy else ''} {n}"
                rows[key] = statistics.median(timed(lambda: scp(n, legacy)) for _ in range(args.repeat))
                print(f"{key} host(s): {rows[key]:.3f}s", flush=True)

        # the remote login shell's start-up, which every exec pays (push once per host, scp -O too)
        def shell_true():
            h = hosts[0]
            subprocess.run(
                [
                    "ssh",
                    "-i",
                    str(h.client_key),
                    "-o",
                    f"UserKnownHostsFile={h.known_hosts}",
                    "-o",
                    "StrictHostKeyChecking=yes",
                    "-p",
                    str(h.port),
                    f"root@{h.addr}",
                    "true",
                ],
                check=True,
            )

        rows["ssh true"] = statistics.median(timed(shell_true) for _ in range(args.repeat))

        p1 = rows["push 1"]
        lines = [
            "# `ddtree-deploy push` benchmark (loopback sshd hosts)",
            "",
            f"{len(bs.files)} files, {nbytes} bytes ({bs.series_id}); smoke = py_compile only; "
            f"{os.cpu_count()} CPU(s) shared by the client, every sshd and every remote Python; "
            f"median of {args.repeat} runs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
            "",
            "| measurement | seconds | ratio | target |",
            "|---|---:|---:|---|",
        ]
        for n in counts:
            r = rows[f"push {n}"] / p1
            tgt = "<= 1.5x push 1" if n == max(counts) and n > 1 else ""
            ok = "" if not tgt else (" (met)" if r <= 1.5 else " (NOT met)")
            lines.append(f"| push to {n} host(s) | {rows[f'push {n}']:.3f} | {r:.2f}x push 1 | {tgt}{ok} |")
        lines.append(
            f"| re-push, unchanged (1 host) | {rows['re-push 1']:.3f} | file bytes sent: {repush_bytes} | "
            f"0 bytes{' (met)' if repush_bytes == 0 else ' (NOT met)'} |"
        )
        for n in sorted({1, nmax}):
            for legacy in (False, True):
                key = f"scp{' -O' if legacy else ''} {n}"
                ref = rows[f"push {n}"] / rows[key]
                lines.append(
                    f"| raw `{key.split(' ' + str(n))[0]}` to {n} host(s) | {rows[key]:.3f} | "
                    f"push {n} = {ref:.2f}x this | <= 2x{' (met)' if ref <= 2 else ' (NOT met)'} |"
                )
        lines.append(f"| `ssh host true` (login shell start-up) | {rows['ssh true']:.3f} | | context |")
        lines += [
            "",
            "Client CPU (this process, all threads) per push: "
            + ", ".join(f"{n} host(s) {c:.2f}s CPU in {w:.2f}s wall" for n, (c, w) in sorted(cpu.items()))
            + ".",
            f"Re-push protocol overhead: {repush_wire} bytes (the agent's source and the request; no file content).",
            "Push runs one SSH exec per host (one remote shell + one Python start) carrying the preflight probe and the",
            "apply (backup, temp file + sha256 verify + rename, py_compile, audit); `scp` (SFTP mode) needs no remote shell.",
        ]
        md = "\n".join(lines) + "\n"
        print()
        print(md)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    finally:
        for h in hosts:
            h.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
