"""The harness starts a real RocketMQ that stores and delivers messages (Phase 1)."""

from __future__ import annotations

import functools
import re

from harness.polling import wait_for
from harness.rocketmq.releases import LEGACY_VERSION, MqadminError
from harness.rocketmq.server import CLUSTER, RocketMQ


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
        # On a loaded machine mqadmin's route lookup or send can time out; it then prints a stack
        # trace and no SEND_OK, and exits 0. Such a send is made again (it may have been stored:
        # RocketMQ delivers at least once, so a body may come back twice).
        wait_for(
            f"mqadmin sendMessage {body} to answer SEND_OK",
            functools.partial(acknowledged, rocketmq, topic_name, body),
            60,
            retry_on=(MqadminError,),
        )

    def consumed() -> list[str] | None:
        args = ("-t", topic_name, "-b", "broker-a", "-i", "1", "-o", "0", "-c", "10", "-g", "it-reader")
        out = rocketmq.mqadmin("consumeMessage", *args).stdout
        # consumeMessage prints each message, then "BODY: <text>".
        found = list(dict.fromkeys(re.findall(r"BODY: (order-\d)", out)))
        return found if len(found) == len(bodies) else None

    assert wait_for("the bodies consumed back", consumed, 60, retry_on=(MqadminError,)) == bodies


def acknowledged(rocketmq: RocketMQ, topic: str, body: str) -> bool:
    """``mqadmin sendMessage`` of ``body`` (its key too) to broker-a's queue 1: whether it said SEND_OK."""
    args = ("-t", topic, "-p", body, "-k", body, "-b", "broker-a", "-i", "1")
    return "SEND_OK" in rocketmq.mqadmin("sendMessage", *args).stdout


def test_the_4x_release_runs_and_serves_routes(topic_name: str) -> None:
    with RocketMQ(LEGACY_VERSION) as legacy:
        route = legacy.create_topic(topic_name, 3)
        assert [(q.broker_name, q.read_queue_nums, q.perm) for q in route.queue_datas] == [("broker-a", 3, 6)]
        assert legacy.cluster_info().brokers["broker-a"].master_address == legacy.broker_addr("broker-a")
