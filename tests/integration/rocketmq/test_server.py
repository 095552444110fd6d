"""The harness starts a real RocketMQ that stores and delivers messages (Phase 1)."""

from __future__ import annotations

import re

from harness.rocketmq import CLUSTER, LEGACY_VERSION, RocketMQ


def test_brokers_register_with_the_nameserver(rocketmq: RocketMQ) -> None:
    info = rocketmq.cluster_info()
    assert info.clusters[CLUSTER] == ("broker-a", "broker-b")
    for name in ("broker-a", "broker-b"):
        assert info.brokers[name].master_address == rocketmq.broker_addr(name)


def test_created_topic_has_the_asked_queue_counts(rocketmq: RocketMQ, topic_name: str) -> None:
    route = rocketmq.create_topic(topic_name, read_queues=4, write_queues=2, brokers=["broker-b"])
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas] == [
        ("broker-b", 4, 2, 6)
    ]


def test_messages_sent_with_mqadmin_are_consumed_back(rocketmq: RocketMQ, topic_name: str) -> None:
    rocketmq.create_topic(topic_name, 2)
    bodies = [f"order-{i}" for i in range(3)]
    for body in bodies:
        sent = rocketmq.mqadmin(
            "sendMessage", "-t", topic_name, "-p", body, "-k", body, "-b", "broker-a", "-i", "1"
        )
        assert "SEND_OK" in sent.stdout, sent.stdout
    got = rocketmq.mqadmin(
        "consumeMessage",
        "-t",
        topic_name,
        "-b",
        "broker-a",
        "-i",
        "1",
        "-o",
        "0",
        "-c",
        "10",
        "-g",
        "it-reader",
    )
    # consumeMessage prints each message, then "BODY: <text>".
    assert re.findall(r"BODY: (order-\d)", got.stdout) == bodies, got.stdout


def test_the_4x_release_runs_and_serves_routes(topic_name: str) -> None:
    with RocketMQ(LEGACY_VERSION) as legacy:
        route = legacy.create_topic(topic_name, 3)
        assert [(q.broker_name, q.read_queue_nums, q.perm) for q in route.queue_datas] == [("broker-a", 3, 6)]
        assert legacy.cluster_info().brokers["broker-a"].master_address == legacy.broker_addr("broker-a")
