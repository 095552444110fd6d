# mqbalance developer commands. `make demo` and `make test` work on a fresh machine:
# they create the virtual environment and build the local control plane when missing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The integration suite runs against the current Kubernetes release (built from Go modules) by
# default; `make test-k8s-1.20` runs it against 1.20 (Debian's source package). See
# docs/local-cluster.md.
.PHONY: help venv control-plane control-plane-1.20 demo test test-k8s-1.20 test-unit lint format bench crds clean

help:
	@echo "make demo           run the local demo (control plane, operator, sidecar, scaling)"
	@echo "make test           lint, type-check and run every test (unit, Spark, integration on current Kubernetes)"
	@echo "make test-k8s-1.20  the integration tests against Kubernetes 1.20"
	@echo "make test-unit      only the fast tests that need no control plane or Spark"
	@echo "make lint           ruff and mypy"
	@echo "make bench          run the benchmarks in bench/ (prints tables)"
	@echo "make control-plane  build or reuse current Kubernetes (apiserver, controller-manager, ...), etcd, helm, promtool"
	@echo "make control-plane-1.20  the same for Kubernetes 1.20"
	@echo "make crds           copy crds/ into the Helm chart"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

control-plane:
	bash hack/build-control-plane.sh --k8s current

control-plane-1.20:
	bash hack/build-control-plane.sh --k8s 1.20

demo: venv control-plane
	$(BIN)/python -m harness.demo

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p mqbalance
	$(BIN)/mypy harness tests bench

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: venv control-plane lint
	MQBALANCE_K8S_VERSION=current $(BIN)/pytest

test-k8s-1.20: venv control-plane-1.20
	MQBALANCE_K8S_VERSION=1.20 $(BIN)/pytest tests/integration

test-unit: venv
	$(BIN)/pytest tests/unit

bench: venv control-plane
	$(BIN)/python bench/bench_allocation.py
	$(BIN)/python bench/bench_sidecar.py
	$(BIN)/python bench/bench_replay.py
	$(BIN)/python bench/bench_rebalance_latency.py
	$(BIN)/python bench/bench_operator_scale.py --groups 1000

crds:
	cp crds/*.yaml charts/mqbalance/crds/

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
