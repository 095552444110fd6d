# mqbalance developer commands. `make demo` and `make test` work on a fresh machine:
# they create the virtual environment and build the local control plane when missing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help venv control-plane node images demo demo-node test test-node test-unit lint format bench bench-node crds clean

help:
	@echo "make demo           run the local demo: on real pods when a real node can run here, else pods acted out"
	@echo "make demo-node      build the real node and images if needed, run the demo on real pods (root)"
	@echo "make test           lint, type-check and run every test (unit, Spark, integration)"
	@echo "make test-node      the real-pod tests: helm install, scaling, probes, bad input on a real node (root)"
	@echo "make test-unit      only the fast tests that need no control plane or Spark"
	@echo "make lint           ruff and mypy"
	@echo "make bench          run the benchmarks in bench/ (prints tables)"
	@echo "make control-plane  build or reuse kube-apiserver, etcd, helm, promtool"
	@echo "make node           also kubelet, kube-scheduler, kube-proxy, pause; install containerd, runc, CNI"
	@echo "make images         build or reuse the container images (mmdebstrap base, podman, pause)"
	@echo "make crds           copy crds/ into the Helm chart"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

control-plane:
	bash hack/build-control-plane.sh

node:
	bash hack/build-control-plane.sh --node

images: node
	bash hack/build-images.sh

demo: venv control-plane
	$(BIN)/python -m harness.demo

demo-node: venv node images
	$(BIN)/python -m harness.demo --mode real

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p mqbalance
	$(BIN)/mypy harness tests bench

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: venv control-plane lint
	$(BIN)/pytest

test-unit: venv
	$(BIN)/pytest tests/unit

test-node: venv node images
	$(BIN)/pytest -m node tests/node

bench: venv control-plane
	$(BIN)/python bench/bench_allocation.py
	$(BIN)/python bench/bench_sidecar.py
	$(BIN)/python bench/bench_replay.py
	$(BIN)/python bench/bench_rebalance_latency.py
	$(BIN)/python bench/bench_operator_scale.py --groups 1000

bench-node: venv node images
	$(BIN)/python bench/bench_real_pods.py

crds:
	cp crds/*.yaml charts/mqbalance/crds/

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
