"""``ddtree-deploy demo``: the whole remote flow against a throwaway loopback host, no setup needed.

Starts an OpenSSH sshd on 127.0.0.x with generated keys; the host's "site-packages" is a venv
holding the real pinned SGLang (the verified snapshot plus the wheel's dist-info); SGLang's import
dependencies come from this interpreter's site-packages through a .pth file. Then it runs
status (refused: unknown host key) -> status --accept-new-host-key -> push --dry-run -> push ->
status -> smoke -> push again (nothing to send) -> history -> rollback -> status, and stops the
sshd. Everything lives in one temp directory, removed at the end unless ``--keep``. Without
``--build`` it pushes the repo's series; when that does not build, the demo fails with the build's
error and exit code (there is no stand-in build).
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

from ddtree_deploy.cli.console import Environment
from ddtree_deploy.testing_sshd import FakeHost, sshd_available, unpack_wheel, write_inventory


def _deps_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "orjson", "pydantic"))


def run_demo(
    main: Callable[[list[str]], int],
    env: Environment,
    *,
    keep: bool = False,
    build_dir: Path | None = None,
    full_smoke: bool = True,
) -> int:
    """Run the demo, driving the CLI through ``main`` (the CLI's entry point, injected by the caller);
    the narration goes to ``env``'s stderr."""
    err = env.err
    from ddtree_deploy.pin import snapshot

    why = sshd_available()
    if why:
        err.print(f"[bold red]demo needs a local OpenSSH server:[/] {why}")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-demo-"))
    host: FakeHost | None = None
    code = 0
    try:
        snap = snapshot.ensure_snapshot()
        if build_dir is None:  # the repo's series, or the demo fails (no stand-in build)
            build_dir = tmp / "build"
            from ddtree_deploy.build.build import build

            build(build_dir)
            err.print(f"built the repo's series into {build_dir}")
        err.rule("[bold]1. a throwaway host on loopback")
        deps = _deps_available()
        host = FakeHost.create(
            tmp / "host", random.randint(10, 200), "demo", extra_site=[sysconfig.get_paths()["purelib"]] if deps else None
        )
        shutil.copytree(snap / "sglang", host.site / "sglang", symlinks=True)
        unpack_wheel(snapshot.wheel_path(), host.site, [])
        host.start()
        err.print(f"sshd on {host.addr}:{host.port} (pid {host.proc.pid}); SGLang 0.5.23 in {host.site}")
        table = host.inventory_table(site_packages=str(host.site), smoke_timeout=300)
        if not (full_smoke and deps):
            table["smoke_modules"] = []
            table["smoke_run"] = []
            err.print("[yellow]smoke = py_compile only[/] (SGLang's import deps are not installed here, or --light-smoke)")
        inv = write_inventory(tmp / "hosts.toml", {"demo": table})
        err.print(f"inventory: {inv}")
        INV = ["--inventory", str(inv)]
        B = ["--build", str(build_dir)]
        steps = [
            ("2. unknown host key: refused (nothing trusted by default)", ["status", "demo", *INV], 6),
            (
                "3. accept it explicitly (recorded in the host's known_hosts)",
                ["status", "demo", "--accept-new-host-key", *INV, *B],
                0,
            ),
            (
                "4. push --dry-run: a diff per file (first lines), nothing written",
                ["push", "demo", "--dry-run", "--diff-lines", "8", *INV, *B],
                0,
            ),
            (
                "5. push: preflight, lock, backup, atomic upload, compile + smoke, audit",
                ["push", "demo", "--why", "demo", *INV, *B],
                0,
            ),
            ("6. status", ["status", "demo", *INV, *B], 0),
            ("7. smoke (re-run on what is deployed)", ["smoke", "demo", *INV, *B], 0),
            ("8. push again: nothing to send", ["push", "demo", *INV, *B], 0),
            ("9. history (the host's audit log)", ["history", "demo", *INV], 0),
            ("10. rollback: restore from the host's backup, verified", ["rollback", "demo", "--why", "demo", *INV], 0),
            ("11. status: pristine again", ["status", "demo", *INV, *B], 0),
        ]
        for title, argv, want in steps:
            err.rule(f"[bold]{title}")
            err.print("$ ddtree-deploy " + " ".join(argv), markup=False, highlight=False)
            t0 = time.monotonic()
            got = main(argv)
            err.print(f"[dim]exit {got} in {time.monotonic() - t0:.1f}s[/]")
            if got != want:
                err.print(f"[bold red]demo step failed:[/] expected exit {want}, got {got}")
                code = 1
                break
        if code == 0:
            err.rule("[bold green]demo ok")
            err.print(f"state directory on the host: {host.state_dir} (deploys/, audit.log)")
    finally:
        if host is not None:
            host.stop()
        if keep:
            err.print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return code
