"""Fixtures of the real-pod tests (``make test-node``): one real node for the session.

Every test below tests/node/ is marked ``node`` and deselected from the default run
(pyproject's ``-m "not node"``); ``make test-node`` selects them. They need root: the node
runs containerd, a kubelet and kube-proxy on this machine (see docs/real-node.md). Where a
real node cannot run, the session fails with the reason: these tests are never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.node import host
from harness.node.cluster import RealNode
from harness.node.images import Images, ensure_images
from harness.node.requirements import unavailable
from harness.node.specs import NODE_IP
from harness.node.workload import GROUP, NAMESPACE, apply_example_consumers, install_chart, rollout_status

_HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: faults on three real nodes, longer; run by `make test-chaos`, not `make test-node`"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.node)
    # Tests marked chaos run only when the marker expression names them (make test-chaos).
    if "chaos" not in (config.getoption("markexpr", "") or ""):
        chaos = [item for item in items if item.get_closest_marker("chaos") is not None]
        if chaos:
            config.hook.pytest_deselected(items=chaos)
            items[:] = [item for item in items if item.get_closest_marker("chaos") is None]


@pytest.fixture(scope="session")
def images() -> Images:
    """The project's image and the sandbox image, built (or unchanged) by hack/build-images.sh."""
    return ensure_images()


@pytest.fixture(scope="session")
def node(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """A running real node; its logs stay in pytest's temporary directory for a failed run."""
    reason = unavailable(need_built=False)
    if reason is not None:
        pytest.fail(f"a real node cannot run here: {reason}")
    real = RealNode(tmp_path_factory.mktemp("node"), images=images)
    with real:
        yield real
    left = host.leftovers(NODE_IP, [real.containerd_root])
    assert left == [], f"the node left these behind: {left}"


@pytest.fixture(scope="session")
def release(node: RealNode, images: Images) -> None:
    """charts/mqbalance installed with helm (operator Ready), as a user would on a cluster."""
    node.kubectl("create", "namespace", NAMESPACE)  # the chart's sidecar RBAC goes there
    install_chart(node, images)


@pytest.fixture(scope="session")
def consumers(node: RealNode, images: Images, release: None) -> None:
    """The example Topic, ConsumerGroup (debounce 0) and consumer Deployment (3 pods with the sidecar)."""
    apply_example_consumers(node, images, 3, debounce=0)
    rollout_status(node, GROUP)
