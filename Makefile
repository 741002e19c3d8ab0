# ddtree-deploy: the two quickstart commands are `make demo` and `make test`.
# Each installs what it needs itself: a venv in .venv (pip), openssh-server (apt, as root).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
DD := $(VENV)/bin/ddtree-deploy
PYTHON ?= python3
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: help venv sshd snapshot demo test check build bench clean

help:
	@echo "make demo    push -> status -> smoke -> rollback against a throwaway loopback host"
	@echo "make test    the whole test suite (real sshd on loopback, the real pinned wheel)"
	@echo "make check   ddtree-deploy check on the repo's series"
	@echo "make bench   benchmarks (tables + plots under bench/)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,ddtree,sglang-deps]'
	touch $@

# The SSH tests and the demo run a real OpenSSH server on loopback.
sshd:
	@test -x /usr/sbin/sshd || { echo "installing openssh-server (apt)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null; }

snapshot: venv
	$(DD) snapshot fetch

check: snapshot
	$(DD) check

build: snapshot
	$(DD) build --out build/sglang-0.5.23

demo: venv sshd snapshot
	$(DD) demo

test: venv sshd snapshot
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: venv sshd snapshot
	mkdir -p bench
	$(PY) tools/bench_builder.py --quick --out bench/builder-cpu.md
	$(PY) tools/bench_push.py --out bench/push.md

clean:
	rm -rf build .pytest_cache .hypothesis
