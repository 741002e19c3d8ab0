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


class EnginePool:
    """At most one live engine; ``get(name)`` starts the named config (stopping another)."""

    def __init__(self, site: Path, models: dict, log_dir: Path):
        self.site, self.models, self.log_dir = site, models, log_dir
        self.current: EngineProc | None = None
        self.plain_cache: dict = {}
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
        prompt of ``cases.PLAIN_REFERENCE`` and cached; a prompt outside it starts the
        plain engine again."""
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
        return [self.plain_cache[tuple(p)][:n] for p in prompts]


@pytest.fixture(scope="session")
def engines(re_site, re_models, tmp_path_factory):
    pool = EnginePool(re_site, re_models, tmp_path_factory.mktemp("engine-logs"))
    yield pool
    pool.stop()
    if pool.timings:
        sys.stderr.write("\nreal-engine starts: " + ", ".join(f"{n} {s:.0f}s" for n, s in pool.timings)
                         + "\n")


_WALL = {"first": None, "last": None, "n": 0}


def pytest_runtest_setup(item):
    if HERE in Path(str(item.fspath)).resolve().parents:
        if _WALL["first"] is None:
            _WALL["first"] = time.monotonic()
        _WALL["n"] += 1


def pytest_runtest_teardown(item):
    if HERE in Path(str(item.fspath)).resolve().parents:
        _WALL["last"] = time.monotonic()


def pytest_terminal_summary(terminalreporter):
    if _WALL["first"] is not None and _WALL["last"] is not None:
        terminalreporter.write_line(
            f"real-engine suite (tests/real_engine): {_WALL['n']} tests, wall time "
            f"{_WALL['last'] - _WALL['first']:.0f} s")
