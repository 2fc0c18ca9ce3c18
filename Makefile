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

demo: setup
	$(PY) examples/seed_style.py

# ray[default] (tsm[ray]) for the Ray backend's tests on a real head (scripts/ray-up): about 50 s, once.
$(VENV)/.ray: $(VENV)/.installed
	$(PY) -m pip install -q 'ray[default]>=2.9'
	touch $@

# The main suite, then the Kubernetes tests (a second pytest run: both exit statuses count). As root on a
# machine without the cached Kubernetes build, k8s-build-bg starts that build first, in the background, so it
# overlaps the installs and the main suite; the Kubernetes tests' fixture waits for it (scripts/k8s-up locks).
# --durations lists the slowest tests at the end of each run: where the CI's time goes, for whoever trims it.
test: k8s-build-bg setup $(VENV)/.torch $(VENV)/.ray
	@status=0; \
	$(PY) -m pytest -q --durations=15 || status=$$?; \
	$(PY) -m pytest -q --durations=5 -m kubernetes || status=$$?; \
	exit $$status

test-fast: setup
	$(PY) -m pytest -q -m "not integration"

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

# A single-node Kubernetes 1.20 cluster (built once from Debian's source package, ~10-20 min on 2 cores,
# cached in ~/.cache/tsm/k8s) for trying `-s kubernetes`; `make test-k8s` runs its integration tests on it.
# k8s-build-bg: as root and only while the binaries are not cached, start that build detached at the lowest
# priority (log in the cache's logs/bg-build.log) and return at once; anything else is a no-op.
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
	    START=0 TSM_K8S_CACHE="$(K8S_CACHE)" setsid nice -n 19 scripts/k8s-up >>"$(K8S_CACHE)/logs/bg-build.log" 2>&1 </dev/null & \
	    echo "k8s-build-bg: building Kubernetes in the background (log: $(K8S_CACHE)/logs/bg-build.log)"; \
	  fi; \
	fi

k8s-down:
	scripts/k8s-down

test-k8s: setup
	$(PY) -m pytest -q -m kubernetes tests/integration/test_kubernetes.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
