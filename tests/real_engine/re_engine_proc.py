"""Start/stop one real SGLang engine process (support/engine_driver.py) with bounded timeouts."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"
START_TIMEOUT_S = float(os.environ.get("DDTREE_REAL_ENGINE_START_TIMEOUT", "420"))
CMD_TIMEOUT_S = float(os.environ.get("DDTREE_REAL_ENGINE_CMD_TIMEOUT", "900"))


# (engine name, pid) of every engine process still alive after its engine was stopped.
LEAKED: list[tuple[str, int]] = []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class EngineError(RuntimeError):
    pass


class StartupRefused(EngineError):
    """The engine refused its arguments (a message from SGLang / the series)."""


def engine_env(site: Path) -> dict:
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), str(site)]),
        "SGLANG_USE_CPU_ENGINE": "1",  # SGLang's own CPU switch (srt/utils/common.py:221)
        "TRITON_INTERPRET": "1",  # the Triton attention kernels run under the interpreter
        "DDTREE_REAL_ENGINE_SHIMS": "1",  # support/sitecustomize.py
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "2"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })
    return env


class EngineProc:
    def __init__(self, name: str, kwargs: dict, site: Path, log_dir: Path, extra_env: dict | None = None):
        self.name = name
        self.kwargs = kwargs
        self.log_path = log_dir / f"engine-{name}.log"
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "engine_driver.py"), str(cmd_r), str(res_w)],
            pass_fds=(cmd_r, res_w), stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, env={**engine_env(site), **(extra_env or {})}, start_new_session=True,
        )
        os.close(cmd_r)
        os.close(res_w)
        self._buf = b""
        self.child_pids: list[int] = []
        self.started_s = time.monotonic()
        self._send(kwargs)
        first = self._recv(START_TIMEOUT_S, "startup")
        self.start_wall_s = time.monotonic() - self.started_s
        if "startup_error" in first:
            self.stop()
            raise StartupRefused(first["startup_error"])
        self.server_args = first.get("server_args", {})
        self.child_pids = [int(p) for p in first.get("child_pids", [])]

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _send(self, obj) -> None:
        os.write(self._cmd_w, (json.dumps(obj) + "\n").encode())

    def _recv(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                status = "timed out" if left <= 0 else f"exited rc={self.proc.returncode}"
                self.stop()
                raise EngineError(f"engine {self.name}: {what} {status}; log {self.log_path}:\n"
                                  + self.log_tail())
            r, _, _ = select.select([self._res_r], [], [], min(left, 1.0))
            if r:
                chunk = os.read(self._res_r, 1 << 20)
                if not chunk:
                    continue
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, obj: dict, timeout: float = CMD_TIMEOUT_S) -> dict:
        self._send(obj)
        res = self._recv(timeout, obj.get("op", "?"))
        if "error" in res:
            raise EngineError(f"engine {self.name}: {res['error']}\n{res.get('traceback', '')}\n"
                              + self.log_tail(30))
        return res

    def generate(self, prompts, params, **kwargs) -> list[dict]:
        """``kwargs``: ``Engine.generate``'s other arguments (return_logprob, top_logprobs_num,
        custom_logit_processor = a class name of SGLang's custom_logit_processor module)."""
        if isinstance(params, dict):
            params = [dict(params) for _ in prompts]
        return self.call({"op": "generate", "input_ids": [list(p) for p in prompts],
                          "sampling_params": params, "kwargs": kwargs})["outputs"]

    def script(self, requests: list[dict]) -> list[dict]:
        return self.call({"op": "script", "requests": requests})["outputs"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send({"op": "shutdown"})
            except OSError:
                pass
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of the engine's process group (scheduler, detokenizer) goes too.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(1.0)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for pid in self.child_pids:  # the engine's scheduler/detokenizer: must be gone by now
            if _alive(pid):
                LEAKED.append((self.name, pid))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
