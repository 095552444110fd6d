"""mqbalance's NameServer client against the real NameServer (Phase 2)."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from harness.rocketmq.server import RocketMQ
from mqbalance.model import PERM_READ, UNKNOWN_ZONE, Broker
from mqbalance.rocketmq.nameserver import (
    NameServerClient,
    NameServerUnreachable,
    TopicNotFound,
    invoke,
)
from mqbalance.rocketmq.remoting import RequestCode, ResponseCode, request
from mqbalance.rocketmq.route import decode_topic_route
from tests.integration.rocketmq.conftest import ZONES


def _closed_port() -> str:
    # Bound but never listening: connections are refused at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_route_gives_queue_counts_and_perm_per_broker(rocketmq: RocketMQ, topic_name: str) -> None:
    rocketmq.create_topic(topic_name, read_queues=8, write_queues=4, brokers=["broker-a"])
    rocketmq.create_topic(topic_name, 2, perm=PERM_READ, brokers=["broker-b"])
    route = asyncio.run(NameServerClient(rocketmq.namesrv_addr).topic_route(topic_name))
    # the session's 5.x brokers register their zones (conftest.ZONES); 4.x brokers none
    zones = ZONES if rocketmq.is_5x else {}
    a, b = zones.get("broker-a", UNKNOWN_ZONE), zones.get("broker-b", UNKNOWN_ZONE)
    assert route.to_topic_route().brokers == (
        Broker("broker-a", read_queue_nums=8, write_queue_nums=4, perm=6, zone=a),
        Broker("broker-b", read_queue_nums=2, write_queue_nums=2, perm=PERM_READ, zone=b),
    )
    topic_route = route.to_topic_route()
    assert len(topic_route.readable_queues()) == 10
    assert len(topic_route.writable_queues()) == 4  # broker-b is read-only
    assert route.broker("broker-a") is not None
    assert route.broker("broker-a").master_address == rocketmq.broker_addr("broker-a")  # type: ignore[union-attr]


def test_missing_topic_is_topic_not_found(rocketmq: RocketMQ) -> None:
    with pytest.raises(TopicNotFound, match=r"no-such-topic.*No topic route info"):
        asyncio.run(NameServerClient(rocketmq.namesrv_addr).topic_route("no-such-topic"))


def test_dead_addresses_are_skipped(rocketmq: RocketMQ, topic_name: str) -> None:
    rocketmq.create_topic(topic_name, 1)
    client = NameServerClient(f"{_closed_port()};{rocketmq.namesrv_addr}")
    route = asyncio.run(client.topic_route(topic_name))
    assert {q.broker_name for q in route.queue_datas} == {"broker-a", "broker-b"}
    # The one that answered is asked first next time.
    assert client.addresses[client._first] == rocketmq.namesrv_addr


def test_no_nameserver_reachable_says_which_failed() -> None:
    dead = [_closed_port(), _closed_port()]
    with pytest.raises(NameServerUnreachable) as caught:
        asyncio.run(NameServerClient(dead, timeout=1.0).topic_route("orders"))
    for address in dead:
        assert address in str(caught.value)


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # accepts (in the backlog) but never speaks
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(NameServerUnreachable, match=r"no answer within 0\.5 s"):
            asyncio.run(NameServerClient(address, timeout=0.5).topic_route("orders"))


def test_old_clients_get_fastjson_bare_keys_and_we_read_them(rocketmq: RocketMQ, topic_name: str) -> None:
    # A client announcing a version before 4.9.4 gets fastjson's default output, with the
    # brokerAddrs keys unquoted: the reader must accept it.
    rocketmq.create_topic(topic_name, 3)
    old = replace(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 7, {"topic": topic_name}), version=0)
    response = asyncio.run(invoke(rocketmq.namesrv_addr, old))
    assert response.code == ResponseCode.SUCCESS
    assert b'"brokerAddrs":{0:' in response.body
    route = decode_topic_route(topic_name, response.body)
    assert {b.broker_name: b.master_address for b in route.broker_datas} == {
        "broker-a": rocketmq.broker_addr("broker-a"),
        "broker-b": rocketmq.broker_addr("broker-b"),
    }
