"""A 5.x static topic's route: the logical queues its consumers name, from ``topicQueueMappingByBroker``."""

from __future__ import annotations

import json

from mqbalance.model import PERM_READ, PERM_READ_WRITE
from mqbalance.rocketmq.route import TopicRouteData, decode_topic_route

# The body a 5.3.3 NameServer answered for a topic made by `mqadmin updateStaticTopic -t st -qn 4`
# over two brokers (logical queues 1 and 3 on broker-a, 0 and 2 on broker-b).
STATIC_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:59681"},"brokerName":"broker-b","cluster":"mqbalance",'
    b'"enableActingMaster":false},{"brokerAddrs":{"0":"127.0.0.1:54981"},"brokerName":"broker-a",'
    b'"cluster":"mqbalance","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":'
    b'"broker-b","perm":6,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2},{"brokerName":"broker-a",'
    b'"perm":6,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2}],"topicQueueMappingByBroker":'
    b'{"broker-a":{"bname":"broker-a","currIdMap":{"1":0,"3":1},"dirty":false,"epoch":1795580591054,'
    b'"scope":"__global__","topic":"st","totalQueues":4},"broker-b":{"bname":"broker-b","currIdMap":'
    b'{"0":0,"2":1},"dirty":false,"epoch":1795580591054,"scope":"__global__","topic":"st","totalQueues":4}}}'
)


def test_a_static_topic_is_one_logical_broker_of_total_queues() -> None:
    route = decode_topic_route("st", STATIC_ROUTE)
    assert [(m.broker_name, dict(m.logical_to_physical)) for m in route.queue_mappings] == [
        ("broker-a", {1: 0, 3: 1}),
        ("broker-b", {0: 0, 2: 1}),
    ]
    (broker,) = route.to_topic_route().brokers
    # MQClientInstance.topicRouteData2TopicSubscribeInfo: MessageQueue(topic, "__syslo__global__", 0..3)
    assert (broker.name, broker.read_queue_nums, broker.write_queue_nums) == ("__syslo__global__", 4, 4)
    assert broker.perm == PERM_READ_WRITE
    assert broker.has_master


def test_logical_queues_take_a_zone_only_when_their_brokers_share_it() -> None:
    document = json.loads(STATIC_ROUTE)
    for b in document["brokerDatas"]:
        b["zoneName"] = "zone-a"
    same = decode_topic_route("st", json.dumps(document).encode())
    assert same.to_topic_route().brokers[0].zone == "zone-a"
    document["brokerDatas"][0]["zoneName"] = "zone-b"
    mixed = decode_topic_route("st", json.dumps(document).encode())
    assert mixed.to_topic_route().brokers[0].zone == "unknown"
    assert mixed.to_topic_route({"__syslo__global__": "zone-c"}).brokers[0].zone == "zone-c"


def test_a_logical_broker_lacks_a_master_when_a_host_does_and_mappings_grow_by_scope() -> None:
    document = json.loads(STATIC_ROUTE)
    document["brokerDatas"][0]["brokerAddrs"] = {"1": "127.0.0.1:1"}  # broker-b: its slave only
    document["queueDatas"][1]["perm"] = PERM_READ
    document["topicQueueMappingByBroker"]["broker-a"]["totalQueues"] = 6  # grown on one broker so far
    route = decode_topic_route("st", json.dumps(document).encode())
    (broker,) = route.to_topic_route().brokers
    assert (broker.read_queue_nums, broker.has_master, broker.perm) == (6, False, PERM_READ_WRITE)
    document["topicQueueMappingByBroker"]["broker-b"]["scope"] = "east"
    scoped = decode_topic_route("st", json.dumps(document).encode()).to_topic_route()
    assert [(b.name, b.read_queue_nums) for b in scoped.brokers] == [
        ("__syslo__east", 4),
        ("__syslo__global__", 6),
    ]


def test_an_ordinary_route_has_no_mappings() -> None:
    document = json.loads(STATIC_ROUTE)
    del document["topicQueueMappingByBroker"]
    route: TopicRouteData = decode_topic_route("st", json.dumps(document).encode())
    assert route.queue_mappings == ()
    assert [b.name for b in route.to_topic_route().brokers] == ["broker-a", "broker-b"]
