"""``ddtree-deploy demo``: the whole remote flow against a throwaway loopback host, no setup needed.

Starts an OpenSSH sshd on 127.0.0.x with generated keys; the host's production environment is a venv
holding the real pinned SGLang (the verified snapshot plus the wheel's dist-info, RECORD included);
its other packages (pip among them, and SGLang's import dependencies when they are installed here)
come from this interpreter's site-packages through a .pth file.

Part 1, the default for a host that serves traffic, the side-by-side rollout: status (refused:
unknown host key) -> status --accept-new-host-key -> build --wheel -> rollout --dry-run -> rollout
(a venv beside production, the wheel pip-installed there, its RECORD, smoke, its server started on
its own port and health-checked; the server is a stand-in that reports the sglang version it imports,
not SGLang) -> status of production (its RECORD intact; the demo also compares every byte of the
production venv with what it was) -> status of the side-by-side venv -> rollout --remove.

Part 2, in place, for a dedicated eval host: push --dry-run -> push -> status -> smoke -> push again
(nothing to send) -> history -> rollback -> status.

Everything lives in one temp directory, removed at the end unless ``--keep``. Without ``--build`` it
builds the repo's series (with its wheel); when that does not build, the demo fails with the build's
error and exit code (there is no stand-in build).
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import shutil
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

from ddtree_deploy.cli.console import Environment
from ddtree_deploy.paths import default_pin_path
from ddtree_deploy.pin.pin import load_pin
from ddtree_deploy.testing_sshd import FakeHost, sshd_available, standin_server, unpack_wheel, write_inventory


def _deps_available() -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "orjson", "pydantic"))
    except (ImportError, ValueError):  # a blocked module (sys.modules[name] = None)
        return False


def tree_digest(root: Path) -> tuple[int, str]:
    """(files, one sha256 over every file's path, content, mode and mtime) under ``root``; caches aside."""
    h = hashlib.sha256()
    n = 0
    for p in sorted(root.rglob("*")):
        if "__pycache__" in p.parts or p.is_dir() or p.is_symlink():
            continue
        st = p.stat()
        h.update(f"{p.relative_to(root)}\0{st.st_mode:o}\0{st.st_mtime_ns}\0".encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
        n += 1
    return n, h.hexdigest()


def run_demo(
    main: Callable[[list[str]], int],
    env: Environment,
    *,
    keep: bool = False,
    build_dir: Path | None = None,
    full_smoke: bool = True,
) -> tuple[int, list[dict[str, object]]]:
    """Run the demo, driving the CLI through ``main`` (the CLI's entry point, injected by the caller);
    the narration goes to ``env``'s stderr. Returns the exit code and one record per step."""
    err = env.err
    from ddtree_deploy.pin import snapshot

    steps_done: list[dict[str, object]] = []
    why = sshd_available()
    if why:
        env.print_error(f"the demo needs a local OpenSSH server: {why}", "make sshd   (apt-get install openssh-server)")
        return 2, steps_done
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-demo-"))
    host: FakeHost | None = None
    srv = None
    code = 0
    try:
        snap = snapshot.ensure_snapshot()
        if build_dir is None:  # the repo's series, or the demo fails (no stand-in build)
            build_dir = tmp / "build"
            err.print("building the repo's series and its wheel ...")
            from ddtree_deploy.build.build import build

            build(build_dir, wheel=snapshot.pinned_wheel_file(load_pin(default_pin_path())))
            err.print(f"built the repo's series into {build_dir}", markup=False)
        env.rule("[bold]1. a throwaway host on loopback")
        deps = _deps_available()
        host = FakeHost.create(tmp / "host", random.randint(10, 200), "demo", extra_site=[sysconfig.get_paths()["purelib"]])
        if host.site is None:
            raise RuntimeError("FakeHost.create made no site-packages")
        shutil.copytree(snap / "sglang", host.site / "sglang", symlinks=True)
        unpack_wheel(snapshot.wheel_path(), host.site, [])
        host.start()
        err.print(
            f"sshd on {host.addr}:{host.port} (pid {host.proc.pid if host.proc else '?'}); "
            f"production: SGLang 0.5.23 in {host.site}",
            markup=False,
        )
        table = host.inventory_table(site_packages=str(host.site), smoke_timeout=300, health_url="http://127.0.0.1:9/health")
        smoke_light = not (full_smoke and deps)
        if smoke_light:
            table["smoke_modules"] = []
            table["smoke_run"] = []
            err.print(
                "[yellow]smoke = py_compile only[/] (SGLang's import deps, torch among them, "
                "are not installed here, or --light-smoke)"
            )
        srv = standin_server(tmp / "sbs-server")
        venv = tmp / "host-ddtree" / "venv"
        sbs = {
            "side_by_side_of": "demo",
            "venv": str(venv),
            "state_dir": str(tmp / "host-ddtree" / "state"),
            "restart_command": srv.restart_command(str(venv / "bin" / "python"), lifetime=600),
            "stop_command": srv.stop_command(),
            "health_url": srv.health_url(),
            "health_timeout": 60,
            "smoke_timeout": 300,
        }
        if smoke_light:
            sbs["smoke_modules"] = []
            sbs["smoke_run"] = []
        inv = write_inventory(tmp / "hosts.toml", {"demo": table, "demo-ddtree": sbs})
        # The same host as a dedicated eval host: the user's explicit opt-in to patch it in place.
        inv_eval = write_inventory(tmp / "hosts-eval.toml", {"demo": dict(table, allow_in_place=True)})
        err.print(
            f"inventory: {inv} (demo = production; demo-ddtree = a venv beside it, its server on port {srv.port}); "
            f"{inv_eval}: demo as a dedicated eval host (allow_in_place = true)",
            markup=False,
        )
        INV = ["--inventory", str(inv)]
        EVAL = ["--inventory", str(inv_eval)]
        B = ["--build", str(build_dir)]
        prod_before = tree_digest(host.venv) if host.venv else (0, "")
        steps: list[tuple[str, list[str], int]] = [
            ("2. unknown host key: refused (nothing trusted by default)", ["status", "demo", *INV], 6),
            (
                "3. accept it explicitly (recorded in the host's known_hosts)",
                ["status", "demo", "--accept-new-host-key", *INV],
                0,
            ),
            (
                "4. side-by-side rollout (a host that serves traffic), dry run: checks production and the venv, writes nothing",
                ["rollout", "demo-ddtree", "--dry-run", *INV, *B],
                0,
            ),
            (
                "5. rollout: a venv beside production, pip install of the DDTree wheel (hash-pinned), RECORD, smoke, "
                "its own server on its own port, health check",
                ["rollout", "demo-ddtree", "--why", "demo", *INV, *B],
                0,
            ),
            ("6. status of production: every file matches its RECORD (untouched)", ["status", "demo", "--strict", *INV], 0),
            ("7. status of the side-by-side venv: the build's files, patched", ["status", "demo-ddtree", *INV, *B], 0),
            ("8. rollout --remove: stop its server, delete the venv", ["rollout", "demo-ddtree", "--remove", *INV], 0),
            (
                "9. push of production: refused (demo serves traffic: demo-ddtree sits beside it)",
                ["push", "demo", *INV, *B],
                2,
            ),
            (
                "10. in place (a dedicated eval host, allow_in_place = true): push --dry-run, a diff per file",
                ["push", "demo", "--dry-run", "--diff-lines", "8", *EVAL, *B],
                0,
            ),
            (
                "11. push: preflight, lock, backup, atomic upload, compile + smoke, audit",
                ["push", "demo", "--why", "demo", *EVAL, *B],
                0,
            ),
            ("12. status", ["status", "demo", *EVAL, *B], 0),
            ("13. smoke (re-run on what is deployed)", ["smoke", "demo", *EVAL, *B], 0),
            ("14. push again: nothing to send", ["push", "demo", *EVAL, *B], 0),
            ("15. history (the host's audit log)", ["history", "demo", *EVAL], 0),
            ("16. rollback: restore from the host's backup, verified", ["rollback", "demo", "--why", "demo", *EVAL], 0),
            ("17. status: pristine again", ["status", "demo", "--strict", *EVAL, *B], 0),
        ]
        for title, argv, want in steps:
            env.rule(f"[bold]{title}")
            err.print("$ ddtree-deploy " + " ".join(argv), markup=False, highlight=False)
            t0 = time.monotonic()
            got = main(argv)
            steps_done.append({"step": title, "argv": argv, "exit_code": got, "expected": want})
            err.print(f"[dim]exit {got} in {time.monotonic() - t0:.1f}s[/]")
            if got != want:
                env.print_error(
                    f"demo step failed: expected exit {want}, got {got}", "rerun with --keep and -v to look at the host"
                )
                code = 1
                break
            if argv[:2] == ["rollout", "demo-ddtree"] and "--remove" in argv and host.venv:
                prod_after = tree_digest(host.venv)
                same = prod_after == prod_before
                steps_done.append({"step": "production byte for byte", "files": prod_after[0], "unchanged": same})
                err.print(
                    f"production venv {host.venv}: {prod_after[0]} files, "
                    + ("byte for byte as before the rollout (content, mode, mtime)" if same else "CHANGED")
                )
                if not same:
                    code = 1
                    break
        if code == 0:
            env.rule("[bold green]demo ok")
            err.print(f"state directories on the host: {host.state_dir}, {sbs['state_dir']}", markup=False)
    finally:
        if srv is not None:
            srv.kill()
        if host is not None:
            host.stop()
        if keep:
            err.print(f"kept {tmp}", markup=False)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return code, steps_done
