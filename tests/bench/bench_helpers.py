"""Helpers for the bench/compare tests: the stand-in SGLang server on loopback.

The stand-in (``tools/standin_server/server.py``) serves the offline DDTree engine with a tiny random model
on the CPU. Every server a test starts is stopped by the fixture (and stops by itself anyway:
``--max-lifetime``, parent watch).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tools" / "standin_server" / "server.py"
# Small and fast on a CPU; the same engine settings are used for the offline .pt baseline.
ENGINE_ARGS = ["--block-size", "8", "--vocab", "512", "--drafter-quality", "0.8", "--threads", "1"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def core_env(tmp_root: Path) -> dict[str, str]:
    """Env so that subprocesses import ddtree_deploy / ddtree_offline and the DDTree core.

    The core comes from the repository's patch series through ``ddtree_deploy.build.overlay`` when that
    works here; otherwise the series' new file is extracted with ``git apply`` and handed over via
    ``DDTREE_UTILS_PATH`` (the engine's documented route for machines that only carry the files).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "deploy"), str(REPO / "tools"), env.get("PYTHONPATH", "")])
    if env.get("DDTREE_UTILS_PATH"):
        return env
    probe = subprocess.run(
        [sys.executable, "-c", "from ddtree_offline.core import ddtree_utils; ddtree_utils()"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    if probe.returncode != 0:
        series = REPO / "patches" / "sglang-0.5.23"
        # the patch that adds ddtree_utils.py (the tree builder's), whatever its number
        patch = next(p for p in sorted(series.glob("*.patch")) if "b/sglang/srt/speculative/ddtree_utils.py" in p.read_text())
        out = tmp_root / "core"
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "apply", "--directory=", "--unsafe-paths", str(patch)], cwd=out, check=True, capture_output=True)
        env["DDTREE_UTILS_PATH"] = str(out / "sglang" / "srt" / "speculative" / "ddtree_utils.py")
    return env


def wait_health(url: str, proc: subprocess.Popen | None, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"stand-in exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}/health did not answer within {timeout}s")


@contextlib.contextmanager
def standin(env: dict[str, str], *extra: str):
    """Start the stand-in on a free loopback port; yield its URL; always stop it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "--port", str(port), "--max-lifetime", "300", *ENGINE_ARGS, *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_health(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_cli(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
