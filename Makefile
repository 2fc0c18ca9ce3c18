# The commands the README gives. Everything installs itself into .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)

.PHONY: setup compile demo test test-fast bench bench-smoke harden lint slurm-up slurm-down sshd-up sshd-down clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed compile

# Byte-compile tsm as an installed package would be (this also covers PYTHONDONTWRITEBYTECODE=1 shells),
# so start-up figures measure tsm, not the compiler.
compile: $(VENV)/.installed
	@$(PY) -m compileall -q src/tsm

# torch is needed only by the torchrun tests and the side-by-side timer benchmark: a CPU wheel, 2.13.0 only.
# numpy comes with it: without numpy, every `import torch` (each torchrun worker too) prints a UserWarning
# "Failed to initialize NumPy" into the output.
$(VENV)/.torch: $(VENV)/.installed
	$(PY) -m pip install -q torch==2.13.0 numpy
	touch $@

# The demo ends by saying where `tsm` is: it is in $(VENV), which no shell has on its PATH until activated.
demo: setup
	$(PY) examples/seed_style.py
	@echo "tsm is installed in $(BIN): run $(BIN)/tsm, or activate its environment first: source $(BIN)/activate"

# ray[default] (tsm[ray]) for the Ray backend's tests on a real head (scripts/ray-up): about 50 s, once.
$(VENV)/.ray: $(VENV)/.installed
	$(PY) -m pip install -q 'ray[default]>=2.9'
	touch $@

# The tracker backends' clients (tsm[mlflow,wandb,tensorboard]) for tests/tracker: mlflow is the full package
# (the tests start its tracking server), about 3.5 min on a loaded 2-core machine; wandb and tensorboard ~15 s.
$(VENV)/.trackers: $(VENV)/.installed
	$(PY) -m pip install -q 'mlflow>=2.10' 'wandb>=0.16' 'tensorboard>=2.14'
	touch $@

# The whole suite as side-by-side pytest runs (tests/suites.py: one per real engine, the rest on every core with
# pytest-xdist), with lint and the docs site beside them; its report gives each run's span, the engines'
# start-up and the 20 slowest tests. As root on a machine without the cached Kubernetes build, k8s-build-bg
# starts that build first, in the background, so it overlaps the installs and the other runs; the Kubernetes
# run's fixture waits for it (scripts/k8s-up locks).
# TEST_TARGETS: the make targets run beside the pytest runs, each as one more run whose status counts; a suite
# of its own joins with `TEST_TARGETS += test-NAME` next to its rule.
TEST_TARGETS ?= lint docs
# tools: as root, the Debian tools some tests run (shellcheck lints the Slurm batch programs); elsewhere a no-op.
# apt-get runs under the bring-up scripts' apt lock (scripts/one-at-a-time.sh): they may be installing beside it.
.PHONY: tools
tools:
	@if [ "$$(id -u)" = 0 ] && ! command -v shellcheck >/dev/null 2>&1; then \
	  mkdir -p /run/lock; APT="flock -w 1800 /run/lock/tsm-apt.lock apt-get -o DPkg::Lock::Timeout=600"; \
	  $$APT install -y -qq --no-install-recommends shellcheck >/dev/null 2>&1 || \
	  { $$APT update -qq && $$APT install -y -qq --no-install-recommends shellcheck >/dev/null; }; \
	fi

test: k8s-build-bg tools setup $(VENV)/.torch $(VENV)/.ray $(VENV)/.trackers $(VENV)/.docs
	$(PY) tests/suites.py $(addprefix --make ,$(TEST_TARGETS))

# TorchX 0.7.0's own unit tests, unchanged, through `python -m tsm.torchx_alias` (tests/compat/torchx/upstream.py):
# one process per module, a fresh home and config folder each, a time limit per test. The last line is
# "TorchX 0.7.0's own tests: N passed, N failed, N not applicable"; any failure fails the target. The folder is
# read in place (TORCHX_TESTS=DIR to point elsewhere); without it the target says so and passes, unless CI=true.
# Those tests import torch and importlib-metadata (which TorchX itself depends on), installed here once.
TORCHX_TESTS ?= ../shared/torchx-0.7.0-tests
$(VENV)/.torchx-tests: $(VENV)/.installed
	$(PY) -m pip install -q importlib-metadata
	touch $@

.PHONY: test-torchx
TEST_TARGETS += test-torchx
test-torchx: setup $(VENV)/.torch $(VENV)/.torchx-tests
	$(PY) tests/compat/torchx/upstream.py --tests $(TORCHX_TESTS)

# The opt-in `torchx` command on tsm (a console script; it refuses to start where the real torchx is installed)
.PHONY: torchx-cli
torchx-cli: setup
	$(PY) -m pip install -q --no-deps ./packaging/tsm-torchx-cli

# The tests that need no real engine, on every core (pytest-xdist): the quick check before a commit.
test-fast: setup
	$(PY) -m pytest -q -m "not integration" -n auto

# The pictures in docs/views.md (docs/*.png, docs/top.svg), taken by the views' browser and terminal tests;
# a plain test run puts them in a scratch folder instead, leaving the working tree as it was.
.PHONY: screenshots
screenshots: setup
	SCREENSHOTS_DIR=$(CURDIR)/docs $(PY) -m pytest -q -p no:cacheprovider tests/views/test_web_browser.py tests/views/test_web_sweep.py tests/views/test_top.py

bench: setup $(VENV)/.torch
	@for script in benchmarks/*.py; do $(PY) $$script || exit 1; done

# Every benchmark at a tiny size (--tiny), so none of them rots: a regression guard, not a measurement (no
# timed assertions). Scripts whose engine (Slurm, Docker, Kubernetes, Ray) is not up print a `skipped` line.
bench-smoke: setup
	@for script in benchmarks/[!_]*.py; do echo "== $$script"; $(PY) $$script --tiny || exit 1; done

# The hardening suite (faults, load, hostile input, security): prints JSON and rewrites README's Reliability table.
harden: setup $(VENV)/.torch
	$(PY) benchmarks/harden.py --readme README.md

# ruff check everywhere; mypy --strict on src (pyproject) and on the backend contract's test kit, which
# backend authors copy from. Formatting is not enforced: see docs/architecture.md ("ruff format").
lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/mypy
	MYPYPATH=tests $(VENV)/bin/mypy tests/schedulers/fake.py tests/schedulers/conformance.py

# The documentation site (mkdocs.yml: Material + mkdocstrings; the CLI reference is generated from the parsers)
# into build/site. Strict: any warning (a broken link, a docstring mkdocstrings cannot read) fails the build.
.PHONY: docs bench-torchx
$(VENV)/.docs: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict  # not -q: it hides the warnings strict counts

# The side-by-side benchmark against TorchX 0.7 (benchmarks/compare_torchx.py) in a virtualenv of its own:
# TorchX 0.7 pins an old urllib3 that breaks the Kubernetes client, so it never goes into .venv.
BENCH_VENV ?= .venv-bench
$(BENCH_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[bench]' torch==2.13.0 numpy
	touch $@

bench-torchx: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/compare_torchx.py

# A single-host Slurm cluster (4 virtual nodes, accounting) for trying `-s slurm`; the tests start it themselves.
slurm-up:
	scripts/slurm-up

slurm-down:
	scripts/slurm-down

# An OpenSSH server on 127.0.0.1:2222 in front of that cluster (key auth, user tsmssh) for `-c ssh=...`;
# the tests start it themselves (tests/integration/ssh_server.py).
sshd-up:
	scripts/sshd-up

sshd-down:
	scripts/sshd-down

.PHONY: ray-up ray-down
# A single-node Ray head (8 logical CPUs, job API on 127.0.0.1:8265) for trying `-s ray`; the tests start it themselves.
ray-up: $(VENV)/.ray
	scripts/ray-up

ray-down:
	scripts/ray-down

.PHONY: docker-up docker-down
docker-up:
	scripts/docker-up

docker-down:
	scripts/docker-down

# A single-node Kubernetes 1.20 cluster (built once from Debian's source package, cached in ~/.cache/tsm/k8s)
# for trying `-s kubernetes`; `make test-k8s` runs its integration tests on it.
# k8s-build-bg: as root and only while the binaries are not cached, start that build detached (log in the
# cache's logs/bg-build.log) and return at once; anything else is a no-op. It runs at the tests' priority, not
# below: on a fresh machine the build and then the Kubernetes tests are the longest chain of `make test`.
.PHONY: k8s-up k8s-down test-k8s k8s-build-bg
K8S_CACHE ?= $(or $(TSM_K8S_CACHE),$(HOME)/.cache/tsm/k8s)
k8s-up:
	scripts/k8s-up

k8s-build-bg:
	@if [ "$$(id -u)" = 0 ] && { [ ! -x "$(K8S_CACHE)/bin/kubelet" ] || [ ! -x "$(K8S_CACHE)/bin/kube-apiserver" ]; }; then \
	  mkdir -p "$(K8S_CACHE)/logs"; \
	  if ! flock -n "$(K8S_CACHE)/build.lock" true; then \
	    echo "k8s-build-bg: a Kubernetes build is already running (log: $(K8S_CACHE)/logs/bg-build.log)"; \
	  else \
	    START=0 TSM_K8S_CACHE="$(K8S_CACHE)" setsid scripts/k8s-up >>"$(K8S_CACHE)/logs/bg-build.log" 2>&1 </dev/null & \
	    echo "k8s-build-bg: building Kubernetes in the background (log: $(K8S_CACHE)/logs/bg-build.log)"; \
	  fi; \
	fi

# engines-bg: as root, bring up the other engines the tests use (Slurm and its sshd, dockerd with the test image,
# the browser) detached, so their apt installs overlap pip's (CI calls it first, beside k8s-build-bg; log in
# build/engines-bg.log). The tests' fixtures then find them up, or wait for a bring-up still going (the scripts
# lock). The torch image needs torch in .venv: the Docker and Kubernetes fixtures build it later.
.PHONY: engines-bg
engines-bg:
	@if [ "$$(id -u)" = 0 ]; then \
	  mkdir -p build; \
	  setsid bash -c 'scripts/slurm-up && scripts/sshd-up; WITH_TORCH=0 scripts/docker-up; scripts/browser-up' \
	    >build/engines-bg.log 2>&1 </dev/null & \
	  echo "engines-bg: starting Slurm, sshd, dockerd and the browser in the background (log: build/engines-bg.log)"; \
	fi

k8s-down:
	scripts/k8s-down

test-k8s: setup
	$(PY) -m pytest -q -m kubernetes tests/integration/test_kubernetes.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
