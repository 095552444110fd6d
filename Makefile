# mqbalance developer commands. `make demo` and `make test` work on a fresh machine:
# they create the virtual environment and build the local control plane when missing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The integration suite runs against the current Kubernetes release (built from Go modules) by
# default; `make test-k8s-1.20` runs it against 1.20 (Debian's source package). See
# docs/local-cluster.md. The real-pod tests (`make test-node`, root) run on a kubelet + containerd
# node of the same release (docs/real-node.md).
.PHONY: help venv control-plane control-plane-demo control-plane-1.20 node images java-oracle rocketmq browser kwok java-test go-test test-rocketmq-lines demo \
	demo-node test test-k8s-1.20 test-node test-chaos test-unit test-mutation test-slow lint format bench bench-node bench-fleet crds release \
	release-previous clean

help:
	@echo "make demo           run the local demo: on real pods when a real node can run here, else pods acted out"
	@echo "make demo-node      build the real node and images if needed, run the demo on real pods (root)"
	@echo "make test           lint, type-check and run every test (unit, Spark, integration on current Kubernetes)"
	@echo "make test-k8s-1.20  the integration tests against Kubernetes 1.20"
	@echo "make test-node      the real-pod tests: helm install, scaling, probes, bad input, a short nemesis run (root)"
	@echo "make test-chaos     the nemesis suite: every fault on three real nodes with RocketMQ messages (root)"
	@echo "make test-unit      only the fast tests that need no control plane or Spark"
	@echo "make test-mutation  the operator tests against deliberately broken operators: each must fail"
	@echo "make test-slow      the long variants of the reliability tests and the decoder fuzz"
	@echo "make lint           ruff, mypy and the import rules (.importlinter)"
	@echo "make bench          run the benchmarks in bench/ (prints tables)"
	@echo "make bench-fleet    kwok's fake nodes: cold start, node loss, rollout, sidecar watches, zone outage (docs/scale.md)"
	@echo "make control-plane  build or reuse current Kubernetes (apiserver, controller-manager, ...), etcd, helm, promtool"
	@echo "make control-plane-1.20  the same for Kubernetes 1.20"
	@echo "make node           a real node's parts too: kubelet, kube-scheduler, kube-proxy, pause; containerd, runc, CNI"
	@echo "make images         build or reuse the container images (mmdebstrap bases, podman, pause, the replay)"
	@echo "make java-oracle    fetch or reuse the RocketMQ client jars the producer's differential tests run"
	@echo "make java-test      build and test clients/java and the Spring Boot starter against a real RocketMQ, API server and sidecars"
	@echo "make go-test        build and test clients/go (the rocketmq-client-go helper), its handover against a real RocketMQ"
	@echo "make test-rocketmq-lines  the RocketMQ suites against 5.3.3 and 4.9.7 as well (CI runs the current line, 5.5.0)"
	@echo "make rocketmq       fetch or reuse Apache RocketMQ's NameServer and Broker, 5.5.0, 5.3.3 and 4.9.7 (Maven Central)"
	@echo "make browser        install Debian's chromium for the report's screenshot test"
	@echo "make kwok           build or reuse kwok (fake nodes for the fleet bench) from Go modules"
	@echo "make crds           copy crds/ into the Helm chart"
	@echo "make release        write dist/: wheel, sdist, chart, image archive, Java jars, SBOMs, checksums"
	@echo "make release-previous  build (once, cached) the previous release's dist/ for the upgrade test"

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

# rocketmq-client versions of tests/oracle (comments stripped); the tests call the same script.
JAVA_ORACLE_VERSIONS := $(shell sed 's/\#.*//' tests/oracle/versions.txt)

java-oracle:
	bash hack/build-java-oracle.sh $(JAVA_ORACLE_VERSIONS) >/dev/null

# Every release the RocketMQ suites run against: the current line, 5.3.3 and 4.9.7 (harness.rocketmq.releases.LINES).
ROCKETMQ_LINES := 5.5.0 5.3.3 4.9.7

rocketmq:
	bash hack/build-rocketmq.sh $(ROCKETMQ_LINES)

browser:
	bash hack/install-browser.sh >/dev/null

node:
	bash hack/build-control-plane.sh --node

images: venv node
	bash hack/build-images.sh

# The virtual environment (downloads) and the part of the control plane the demo starts (a Go
# build) side by side; `make test` builds the rest later, reusing Go's build cache.
demo:
	$(MAKE) -j2 venv control-plane-demo
	$(BIN)/python -m harness.demo

control-plane-demo:
	bash hack/build-control-plane.sh --demo

# dist/ (hack/release.sh; docs/deploy.md, "Release artifacts"). The image step needs root.
release: venv control-plane node
	bash hack/release.sh

# The previous release's dist/ (hack/previous-release), built once per commit into the cache, for
# the upgrade test in `make test-node`. Exit 3 (no such commit in a shallow clone) is not an error:
# the test then skips and says how to fetch it.
release-previous: venv control-plane node
	bash hack/build-previous-release.sh >/dev/null || test $$? -eq 3

demo-node: venv node images
	$(BIN)/python -m harness.demo --mode real

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p mqbalance
	$(BIN)/mypy harness tests bench
	$(BIN)/lint-imports

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# pytest-xdist workers for the suites that wait on a cluster (0: one process). Most integration tests
# wait on events, so two workers on two cores nearly halve the time; tests/conftest.py keeps the
# tests that share RocketMQ, the Java oracle or the Spark session on one worker each.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadscope

# The Java module's tests (their own RocketMQ, API server and sidecars, on free ports) run beside
# pytest; their output goes to build/java-test.log and their summary follows pytest's.
test: venv control-plane java-oracle rocketmq browser kwok lint
	bash hack/beside.sh build/java-test.log '$(MAKE) --no-print-directory java-test go-test' -- \
		env MQBALANCE_K8S_VERSION=current $(BIN)/pytest $(PYTEST_PARALLEL)

# The Java module's tests start harness.javaenv with this .venv (see clients/java/README.md): the
# current line (5.5.0 client and servers) and the 4.x line in CI; then the Spring Boot starter's
# (the example application against 5.5.0 servers). 5.3.3 runs in test-rocketmq-lines: the same
# 5.x client classes as the current line (docs/rocketmq.md, "Releases").
java-test: venv control-plane rocketmq
	mvn -B -ntp -f clients/java/pom.xml -Dmqbalance.test.excludedGroups=none -P rocketmq55 test
	mvn -B -ntp -f clients/java/pom.xml -Dmqbalance.test.excludedGroups=none -P rocketmq4 test
	mvn -B -ntp -f clients/pom.xml -pl java-spring-boot -am -Dmqbalance.test.excludedGroups=none \
		-Dmqbalance.test.rocketmqVersion=5.5.0 -Dtest='io.mqbalance.rocketmq.spring.**' \
		-Dsurefire.failIfNoSpecifiedTests=false test

# clients/go: vet, build (its modules into the cache, as the control plane's) and unit tests; its
# handover test against real RocketMQ and sidecars (harness.javaenv), the current line's servers.
go-test: venv control-plane rocketmq
	bash hack/build-go-client.sh --test >/dev/null
	bash hack/build-go-client.sh --harness-test >/dev/null

# The RocketMQ suites against the releases CI leaves out: the Java module with the 5.3.3 client and
# servers, the route and lag readers and the end-to-end messages with 5.3.3 and 4.9.7 servers.
test-rocketmq-lines: venv control-plane rocketmq
	mvn -B -ntp -f clients/java/pom.xml -Dmqbalance.test.excludedGroups=none test
	for v in 5.3.3 4.9.7; do \
		MQBALANCE_ROCKETMQ_VERSION=$$v MQBALANCE_K8S_VERSION=current $(BIN)/pytest -n 0 \
			tests/integration/rocketmq/test_topic_routes.py tests/integration/rocketmq/test_nameserver_client.py \
			tests/integration/rocketmq/test_lag_offsets.py tests/integration/rocketmq/test_e2e_messages.py || exit 1; \
	done

test-k8s-1.20: venv control-plane-1.20
	MQBALANCE_K8S_VERSION=1.20 $(BIN)/pytest $(PYTEST_PARALLEL) tests/integration

test-unit: venv
	$(BIN)/pytest tests/unit

# The operator broken on purpose (tests/mutation/mutants.py, applied at run time): the tests named
# for each property must fail (docs/reliability.md, "Mutation runs").
test-mutation: venv control-plane
	MQBALANCE_K8S_VERSION=current $(BIN)/pytest -m mutation tests/mutation -s

# The long variants of the reliability tests and the decoder fuzz (marked slow; docs/reliability.md says which and why
# CI leaves them out).
test-slow: venv control-plane
	MQBALANCE_K8S_VERSION=current $(BIN)/pytest --run-slow -m slow tests/unit tests/integration

test-node: venv node images rocketmq
	$(BIN)/pytest -m node tests/node

test-chaos: venv node images rocketmq
	$(BIN)/pytest -m "node and chaos" tests/node

bench: venv control-plane rocketmq
	$(BIN)/python bench/bench_allocation.py
	$(BIN)/python bench/bench_load.py
	$(BIN)/python bench/bench_bounds.py
	$(BIN)/python bench/bench_sidecar.py
	$(BIN)/python bench/bench_replay.py --sizes 400,2000 --modes single,local2
	$(BIN)/python bench/bench_rebalance_latency.py
	$(BIN)/python bench/bench_operator_scale.py --groups 1000
	$(BIN)/python bench/bench_rocketmq_start.py --rounds 3
	$(BIN)/python bench/bench_e2e_messages.py --seconds 90 --rate 200
	$(BIN)/python bench/bench_orderly_failover.py
	$(BIN)/python bench/bench_crash_failover.py

bench-node: venv node images
	$(BIN)/python bench/bench_real_pods.py

# Not in `make test` nor `make bench`: minutes at its default size (docs/scale.md); FLEET_ARGS sizes it,
# e.g. FLEET_ARGS="--nodes 1000 --pods 30000 --groups 3000".
bench-fleet: venv control-plane kwok
	$(BIN)/python bench/bench_fleet.py $(FLEET_ARGS)

# kwok's fake nodes (docs/scale.md): the fleet bench and its smoke test in `make test`.
kwok:
	bash hack/build-kwok.sh >/dev/null

crds:
	cp crds/*.yaml charts/mqbalance/crds/

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
