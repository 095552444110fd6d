"""A real RocketMQ (NameServer + two Brokers from Apache's jars) shared by this folder's tests, of
the tested release (``harness.rocketmq.releases.version_under_test``: the current line, or the release
``MQBALANCE_ROCKETMQ_VERSION`` names); each 5.x broker registers a zone (``broker-a`` in
``zone-a``, ``broker-b`` in ``zone-b``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from harness.kube.cluster import LocalCluster
from harness.rocketmq.releases import is_5x, version_under_test
from harness.rocketmq.server import RocketMQ

ZONES = {"broker-a": "zone-a", "broker-b": "zone-b"}


@pytest.fixture(scope="session")
def rocketmq() -> Iterator[RocketMQ]:
    version = version_under_test()
    zones = ZONES if is_5x(version) else None  # 4.x brokers register no zone
    with RocketMQ(version, brokers=("broker-a", "broker-b"), zones=zones) as running:
        yield running


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name of its own for each test (RocketMQ allows letters, digits, '-', '_', '%', '|')."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()
