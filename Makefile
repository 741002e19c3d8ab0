# ddtree-deploy: the two quickstart commands are `make demo` and `make test`.
# Each installs what it needs itself: a venv in .venv (pip), openssh-server (apt, as root).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
DD := $(VENV)/bin/ddtree-deploy
PYTHON ?= python3
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
# The demo needs only the tool's own dependencies (no torch, no CUDA): its host's smoke is then
# py_compile only. `make test` installs the rest into the same venv.
DEMO_STAMP := $(VENV)/.installed-demo-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
# `make lint` needs only the tool, ruff, mypy, black and isort (no torch).
LINT_STAMP := $(VENV)/.installed-lint-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=
# pytest workers (pytest-xdist): one per core, at most 4 (each real-engine module holds one engine
# process, about 1.5 GB, on one core). WORKERS=0 runs everything in one process.
WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
# how many of the slowest tests pytest lists at the end
DURATIONS ?= 40
# The inner loop (`make test-fast`): everything but the real engine on the CPU (tests/real_engine),
# SGLang's own processes and harnesses (tests/sglang) and the interpreted kernels (tests/kernels,
# tests/h200_harness); pytest 6.0 min on 2 cores (2026-12-07, 368 tests). `make test` runs everything.
FAST_PATHS := tests/foundation tests/deploy tests/bench tests/offline tests/ddtree tests/soak

.PHONY: help venv demo-venv lint-venv sshd snapshot demo test test-fast lint check build bench bench-gpu-bundle h200-bundle h200-flashinfer mutation soak clean

help:
	@echo "make demo    side-by-side rollout, then push -> status -> smoke -> rollback, on a throwaway loopback host"
	@echo "make test    the whole test suite (real sshd on loopback, the real pinned wheel, the real engine)"
	@echo "make test-fast  the inner loop: the suite without the real engine, SGLang harnesses, interpreted kernels"
	@echo "make check   ddtree-deploy check on the repo's series"
	@echo "make lint    ruff (lint + format check), mypy --strict, the series lint (installs no torch)"
	@echo "make bench   CPU benchmarks here: tables + plots under out/bench/ (committed GPU results: bench/)"
	@echo "make mutation  mutation testing of the patch engine + the agent's restore path (slow, bounded)"
	@echo "make soak    soak the real SGLang engine on this CPU with DDTREE (SOAK_REQUESTS, default 200; out/soak)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,ddtree,sglang-deps,real-engine]'
	touch $@

demo-venv: $(DEMO_STAMP)

lint-venv: $(LINT_STAMP)

$(LINT_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[lint]'
	touch $@

$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e .
	touch $@

# The SSH tests and the demo run a real OpenSSH server on loopback.
sshd:
	@test -x /usr/sbin/sshd || { echo "installing openssh-server (apt)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null; }
	@command -v ssh-keygen >/dev/null && command -v scp >/dev/null && command -v unshare >/dev/null && command -v chattr >/dev/null || { \
	  echo "installing openssh-client util-linux e2fsprogs (apt)"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-client util-linux e2fsprogs >/dev/null; }

# The tool alone fetches and verifies the pinned wheel (no torch needed).
snapshot: demo-venv
	$(DD) snapshot fetch

check: snapshot
	$(DD) check

build: snapshot
	$(DD) build --out build/sglang-0.5.23

demo: demo-venv sshd
	$(DD) snapshot fetch
	$(DD) demo

# pytest's summary ends with the seconds each test folder took (tests/conftest.py).
# ruff's rules and mypy's files and overrides live in pyproject.toml ([tool.ruff], [tool.mypy]);
# `make test` runs both first. tools/lint/lint_series.py: black / isort / pyflakes over the series' SGLang files
# (SGLang's formatter and settings; the files the series adds and, where upstream is black-clean, the ones it changes).
LINT_PATHS := deploy/ddtree_deploy tools tests/foundation tests/deploy tests/testkit.py tests/conftest.py
lint: lint-venv snapshot
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(PY) tools/lint/lint_series.py

test: venv sshd snapshot lint
	@start=$$(date +%s); $(PY) -m pytest -q -n $(WORKERS) --durations=$(DURATIONS) $(PYTEST_ARGS); rc=$$?; \
	  echo "make test: pytest wall time $$(( $$(date +%s) - start )) s on $(WORKERS) worker(s) (rc=$$rc)"; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5): a failure"; fi; exit $$rc

test-fast: venv sshd snapshot
	@start=$$(date +%s); $(PY) -m pytest -q -n $(WORKERS) --durations=10 $(FAST_PATHS) $(PYTEST_ARGS); rc=$$?; \
	  echo "make test-fast: pytest wall time $$(( $$(date +%s) - start )) s on $(WORKERS) worker(s) (rc=$$rc)"; exit $$rc

# Benchmarks write tables (and PNG plots) stating the machine; ratios are measured side by side.
bench: venv sshd snapshot
	mkdir -p out/bench
	$(PY) tools/bench/bench_builder.py --quick --threads 1 --out out/bench/builder-cpu.md --json out/bench/builder-cpu.json
	$(PY) tools/bench/bench_push.py --out out/bench/push.md
	PYTHONPATH=tools $(PY) -m ddtree_offline sweep --threads 1 --num-prompts 2 --max-new-tokens 48 \
	  --budgets 16,64,256 --qualities 0.7,0.95 --out-dir out/bench/sweep-cpu
	@echo "tables and plots: out/bench/ (GPU results measured on an H200 are committed under bench/)"

# What a GPU machine with only torch + Triton needs for tools/gpu_kernels/gpu_suite.py and tools/bench/bench_builder.py.
bench-gpu-bundle: venv snapshot
	$(PY) tools/gpu_kernels/make_gpu_bundle.py

# Mutation testing (cosmic-ray, installed by this target only, never by `make test`) over the patch
# engine and the agent's restore path. Slow: bounded by MUTATION_MINUTES; what did not run by then is
# reported as not run. The mutations go into a copy under .work/mutation/; report: .work/mutation/report.md.
MUTATION_MINUTES ?= 60
# A DDTREE server under load and faults (tools/soak/soak.py): concurrent requests, aborts, a KV pool
# that forces retraction, prompts at and past the context; every greedy answer against target-only.
SOAK_REQUESTS ?= 200
soak: venv snapshot
	$(PY) tools/soak/soak.py --cpu --requests $(SOAK_REQUESTS) --out out/soak

mutation: venv sshd snapshot
	$(PY) -m pip install -q 'cosmic-ray==8.7.0'
	$(PY) tests/foundation/mutation/run.py --minutes $(MUTATION_MINUTES)

# What the real-SGLang-engine harness carries to an H200 (docs/h200-harness.md): the patched sglang
# tree, the dependency wheels, the sgl_kernel shim. H200_CARRY=/work/main/.carry-12 copies it there.
h200-bundle: venv snapshot
	$(PY) tools/sglang_h200/make_bundle.py $(if $(H200_CARRY),--carry $(H200_CARRY))

# FlashInfer 0.7.2 trimmed for the same carry (flashinfer.tar.xz + its manifest; docs/h200-harness.md).
h200-flashinfer: venv
	$(PY) tools/sglang_h200/flashinfer_bundle.py --carry $(or $(H200_CARRY),.carry-12)

clean:
	rm -rf build out .pytest_cache .hypothesis
