"""The real SGLang engine on this CPU: fixtures shared by tests/real_engine.

What is real: ``sglang.Engine`` from the pinned 0.5.23 wheel with the repo's series applied
(``overlay.patched_site()``), its scheduler / tokenizer / detokenizer processes, model runner,
Triton attention backend (under ``TRITON_INTERPRET=1``), the DFlash and DDTree workers and
EAGLE's verify. Shims (documented in ``support/``): the launch shims
(``support/sitecustomize.py``) and the ``sgl_kernel`` CPU ops (``support/sgl_kernel``).

Engines start in 20-40 s, so one engine per server config is shared by a whole module, and at
most one engine is alive at a time (``EnginePool``); every engine is stopped (process group
killed) at module end, on failure and at session end. Nothing here is skipped: a missing
dependency fails the suite with the reason.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import re_cases as cases  # tests/real_engine is on pytest's pythonpath (pyproject.toml)
from re_checks import HFGreedy
from re_engine_proc import EngineProc, StartupRefused

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SERIES = REPO / "patches" / "sglang-0.5.23"

pytestmark = pytest.mark.real_engine

_NEEDED = ("torch", "transformers", "tokenizers", "safetensors", "triton", "orjson", "msgspec",
           "pybase64", "zmq", "xgrammar", "uvloop", "setproctitle", "fastapi")


@pytest.fixture(scope="session")
def re_site(tmp_path_factory) -> Path:
    missing = []
    for mod in _NEEDED:
        try:
            __import__(mod)
        except Exception as e:  # noqa: BLE001
            missing.append(f"{mod} ({type(e).__name__}: {e})")
    if missing:
        pytest.fail("the real-engine suite needs SGLang's runtime dependencies; missing: "
                    + ", ".join(missing) + ". fix: make venv (pyproject extras test,ddtree,"
                    "sglang-deps,real-engine)", pytrace=False)
    from ddtree_deploy.build import overlay

    return overlay.patched_site()


@pytest.fixture(scope="session")
def re_models(tmp_path_factory) -> dict:
    import tiny_models as models

    return models.make_all(tmp_path_factory.mktemp("re-models"))


@pytest.fixture(scope="session")
def hf_greedy(re_models) -> HFGreedy:
    return HFGreedy(re_models["target"])


class PlainReferences:
    """The plain engine's greedy tokens, shared by every pytest worker of one run: a JSON file in
    the run's common temp dir, keyed by the target checkpoint's weights hash, written under an
    exclusive lock. The first worker that needs them computes them (one plain engine); the others
    read them instead of starting a plain engine of their own."""

    def __init__(self, shared_dir: Path, target: Path):
        import hashlib

        digest = hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()[:16]
        self.path = shared_dir / f"plain-references-{digest}.json"
        self.lock_path = self.path.with_suffix(".lock")

    def locked(self):
        import contextlib
        import fcntl

        @contextlib.contextmanager
        def hold():
            with open(self.lock_path, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)

        return hold()

    def read(self) -> dict:
        import json

        if not self.path.is_file():
            return {}
        return {tuple(json.loads(k)): v for k, v in json.loads(self.path.read_text()).items()}

    def write(self, refs: dict) -> None:
        import json
        import os

        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({json.dumps(list(k)): v for k, v in refs.items()}))
        os.replace(tmp, self.path)


class EnginePool:
    """At most one live engine; ``get(name)`` starts the named config (stopping another)."""

    def __init__(self, site: Path, models: dict, log_dir: Path, shared: PlainReferences | None = None):
        self.site, self.models, self.log_dir = site, models, log_dir
        self.current: EngineProc | None = None
        self.plain_cache: dict = {}
        self.shared = shared
        self.timings: list[tuple[str, float]] = []

    def kwargs(self, name: str) -> dict:
        return cases.engine_kwargs(name, self.models)

    def get(self, name: str) -> EngineProc:
        if self.current is not None and self.current.name == name:
            return self.current
        self.stop()
        t0 = time.monotonic()
        self.current = EngineProc(name, self.kwargs(name), self.site, self.log_dir)
        self.timings.append((name, time.monotonic() - t0))
        return self.current

    def try_start(self, name: str, kwargs: dict) -> EngineProc:
        """Start a one-off config (e.g. one that must be refused)."""
        self.stop()
        return EngineProc(name, kwargs, self.site, self.log_dir)

    def refusal(self, name: str, kwargs: dict) -> str:
        """Start a config that must be refused at start-up; its refusal message. The test fails
        when the engine starts instead."""
        try:
            eng = self.try_start(name, kwargs)
        except StartupRefused as e:
            return str(e)
        eng.stop()
        pytest.fail(f"engine {name} started; it must be refused at start-up")

    def pristine(self, name: str) -> EngineProc:
        """The named config on the UNPATCHED pinned wheel (the verified snapshot's ``sglang/``)."""
        from ddtree_deploy.pin import snapshot

        self.stop()
        self.current = EngineProc(f"{name}-pristine", self.kwargs(name), snapshot.ensure_snapshot(),
                                  self.log_dir, extra_env={"DDTREE_REAL_ENGINE_PRISTINE": "1"})
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            cur, self.current = self.current, None
            cur.stop()

    def plain(self, prompts, n: int) -> list[list[int]]:
        """The plain (non-speculative) engine's greedy tokens, computed once for every
        prompt of ``cases.PLAIN_REFERENCE`` and cached (in this worker and, through
        ``PlainReferences``, for the other workers of the run); a prompt outside it starts
        the plain engine again."""
        missing = [p for p in prompts if len(self.plain_cache.get(tuple(p), ())) < n]
        if missing and self.shared is not None:
            with self.shared.locked():
                for p, toks in self.shared.read().items():  # keep the longer of two answers
                    if len(toks) > len(self.plain_cache.get(p, ())):
                        self.plain_cache[p] = toks
                self._compute_plain(prompts, n)
                self.shared.write(self.plain_cache)
        elif missing:
            self._compute_plain(prompts, n)
        return [self.plain_cache[tuple(p)][:n] for p in prompts]

    def _compute_plain(self, prompts, n: int) -> None:
        missing = [p for p in prompts if len(self.plain_cache.get(tuple(p), ())) < n]
        if missing:
            prev = self.current.name if self.current is not None else None
            eng = self.get("plain")
            todo = {tuple(p): max(n, cases.PLAIN_REFERENCE.get(tuple(p), 0)) for p in missing}
            for p, cnt in cases.PLAIN_REFERENCE.items():
                if len(self.plain_cache.get(p, ())) < cnt:
                    todo[p] = max(todo.get(p, 0), cnt)
            ps = list(todo)
            outs = eng.generate(ps, [cases.greedy(todo[p]) for p in ps])
            for p, o in zip(ps, outs):
                self.plain_cache[p] = o["output_ids"]
            if prev is not None and prev != "plain":
                self.get(prev)


@pytest.fixture(scope="session")
def engines(re_site, re_models, tmp_path_factory):
    # With pytest-xdist the workers of one run share the parent of their temp dirs.
    import os

    base = tmp_path_factory.getbasetemp()
    shared = PlainReferences(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base, re_models["target"])
    pool = EnginePool(re_site, re_models, tmp_path_factory.mktemp("engine-logs"), shared)
    yield pool
    pool.stop()
    if pool.timings:
        sys.stderr.write("\nreal-engine starts: " + ", ".join(f"{n} {s:.0f}s" for n, s in pool.timings)
                         + "\n")
    # With several workers, test_06 sees only its own worker's engines: every worker checks its own here.
    import re_engine_proc

    if re_engine_proc.LEAKED:
        pytest.fail(f"engine processes alive after shutdown: {re_engine_proc.LEAKED}", pytrace=False)
