"""The operator's offset reads against brokers that check ACL, on 4.9.7 (plain ACL) and 5.3.3 (ACL 2.0).

The brokers refuse unsigned requests. Signed as RocketMQ's ``AclClientRPCHook`` signs them, with
the keys of the Secret a Topic names in ``spec.nameServer.aclSecretRef``, the offsets read are
those ``mqadmin consumerProgress`` shows (a real push consumer of the release's client, signed too,
committed part of the messages); a wrong key is ``QueryRefused``.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from harness import polling
from harness.apps.operator import OperatorProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from harness.rocketmq.acl import Acl
from harness.rocketmq.releases import DEFAULT_VERSION, LEGACY_VERSION
from harness.rocketmq.server import RocketMQ
from mqbalance.operator.offsets import OffsetReader
from mqbalance.rocketmq.remoting import Credentials
from tests.integration.operator_support import apply_group, apply_topic, condition, status_of
from tests.integration.rocketmq.test_lag_offsets import consume, consumer_progress

ACL = Acl()
BROKER = "broker-a"
POD_LABELS = {"app": "acl-lagged"}


@pytest.fixture(scope="module", params=[LEGACY_VERSION, DEFAULT_VERSION])
def secured(request: pytest.FixtureRequest) -> Iterator[RocketMQ]:
    with RocketMQ(request.param, brokers=(BROKER,), acl=ACL) as running:
        yield running


def read(mq: RocketMQ, group: str, topic: str, credentials: Credentials | None) -> Any:
    reader = OffsetReader(mq.namesrv_addr, timeout=polling.scaled(5))
    signer = {topic: credentials} if credentials is not None else None
    return asyncio.run(reader.read_group(group, [(topic, ())], signer))


def test_signed_offset_reads_equal_consumer_progress_and_unsigned_ones_are_refused(
    secured: RocketMQ, topic_name: str
) -> None:
    topic = topic_name[-40:].lstrip("-")
    group = f"GID_{topic}"[:60]
    secured.create_topic(topic, 4)
    secured.send(topic, 60)  # mqadmin signs with conf/tools.yml (the admin account)
    consume(secured, group, topic, 20, ACL.client)
    secured.send(topic, 20)  # lag the consumer cannot have taken

    ours = read(secured, group, topic, ACL.client)
    assert ours.failures == ()
    theirs = consumer_progress(secured, group, topic)
    assert {q: (o.broker_offset, o.consumer_offset, o.lag) for q, o in ours.offsets.items()} == theirs
    # At least the 20 sent after the consumer stopped, and less than all 80: the consumer committed
    # some (not always all 20 it consumed: a client commits what precedes its in-flight messages).
    assert 20 <= sum(diff for _, _, diff in theirs.values()) < 80

    for credentials in (None, Credentials(ACL.client.access_key, "not-the-secret")):
        refused = read(secured, group, topic, credentials)
        assert refused.offsets == {}
        assert [f.reason for f in refused.failures] == ["QueryRefused"], refused.failures
        assert BROKER in refused.failures[0].message


def secret(api: client.ApiClient, namespace: str, name: str, credentials: Credentials) -> None:
    data: dict[str, bytes | str] = {
        "accessKey": base64.b64encode(credentials.access_key.encode()).decode(),
        "secretKey": base64.b64encode(credentials.secret_key.encode()).decode(),
    }
    body = client.V1Secret(metadata=client.V1ObjectMeta(name=name), data=data)
    core = client.CoreV1Api(api)
    try:
        core.create_namespaced_secret(namespace, body)
    except client.ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_secret(name, namespace, body)


# The operator signs alike for both lines (the offset reads above cover 4.9.7): 5.3.3 only.
@pytest.mark.parametrize("secured", [DEFAULT_VERSION], indirect=True)
def test_the_operator_signs_lag_reads_with_the_secret_the_topic_names(
    cluster: LocalCluster,
    crds: None,
    api: client.ApiClient,
    secured: RocketMQ,
    topic_name: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    topic = topic_name[-40:].lstrip("-")
    namespace = f"acl-{uuid.uuid4().hex[:6]}"
    node = f"node-acl-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    kubelet.create_node(api, node, "zone-a")
    operator = OperatorProcess(
        cluster,
        [namespace],
        tmp_path_factory.mktemp("operator-acl"),
        "--lag-interval",
        "1",
        "--lag-timeout",
        "2",
    )
    try:
        kubelet.start_pods(api, namespace, "consumer", 2, POD_LABELS, [node])
        secured.create_topic(topic, 2)
        secured.send(topic, 30)
        secret(api, namespace, "rocketmq-acl", ACL.client)
        name_server = {"addresses": [secured.namesrv_addr], "aclSecretRef": {"name": "rocketmq-acl"}}
        apply_topic(api, namespace, "orders", topicName=topic, nameServer=name_server)
        apply_group(
            api,
            namespace,
            "orders",
            {"groupName": f"GID_{topic}", "topics": ["orders"], "selector": {"matchLabels": POD_LABELS}},
        )
        operator.start()

        def lag(reason: str, total: int | None) -> dict[str, Any] | None:
            status = status_of(api, namespace, "orders")
            got = condition(status, "LagAvailable").get("reason")
            read = total is None or (status.get("lag") or {}).get("total") == total
            return status if got == reason and read else None

        # Nobody consumed: every stored message is lag, as consumerProgress shows a group that never
        # committed. 30 sent; under load a retried send can be stored twice and a failed one not at all.
        stored = secured.stored(topic)
        assert stored > 0
        wait_for(f"status.lag.total {stored}, read signed", lambda: lag("OffsetsRead", stored), 90)

        # The key rotated on the brokers but not in the Secret: the next round is refused.
        secret(api, namespace, "rocketmq-acl", Credentials(ACL.client.access_key, "not-the-secret"))
        status = wait_for("LagAvailable False (QueryRefused)", lambda: lag("QueryRefused", None), 60)
        assert BROKER in condition(status, "LagAvailable")["message"]
        assert status["lag"]["brokersUnavailable"] == [BROKER]
    finally:
        operator.stop()
        core.delete_namespace(namespace)
        kubelet.delete_node(api, node)
