"""RocketMQ's routes as a NameServer answers them: topic route data, broker and queue data, a 5.x
static topic's queue mappings, and the cluster info; the decoders of those bodies.

Pure code, no I/O, like :mod:`mqbalance.rocketmq.remoting` (whose frames carry these bodies and
whose :func:`~mqbalance.rocketmq.remoting.parse_fastjson` reads them). The types follow RocketMQ's
own (``org.apache.rocketmq.remoting.protocol.route.TopicRouteData``, ``QueueData``, ``BrokerData``,
``TopicQueueMappingInfo``, ``ClusterInfo``), 4.x and 5.x alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqbalance.model import PERM_READ, PERM_WRITE, Broker, TopicRoute
from mqbalance.rocketmq.remoting import FrameError, parse_fastjson

MASTER_ID = 0
"""MixAll.MASTER_ID: the brokerAddrs key of a broker group's master."""


@dataclass(frozen=True)
class QueueData:
    """A broker's queues of one topic (RocketMQ's QueueData)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass(frozen=True)
class BrokerData:
    """A broker group: its cluster and the address of each member by broker id (0 is the master)."""

    broker_name: str
    cluster: str
    addresses: Mapping[int, str]
    zone: str | None = None
    """The zone the broker registered with (5.x: ``-Drocketmq.zone`` or ``$ROCKETMQ_ZONE`` on the
    broker; RocketMQ's ``zoneName``); None when it gave none (every 4.x broker)."""

    @property
    def master_address(self) -> str | None:
        return self.addresses.get(MASTER_ID)


LOGICAL_QUEUE_MOCK_BROKER_PREFIX = "__syslo__"
"""MixAll.LOGICAL_QUEUE_MOCK_BROKER_PREFIX: the broker name of a static topic's logical queues."""
METADATA_SCOPE_GLOBAL = "__global__"


@dataclass(frozen=True)
class QueueMapping:
    """One broker's share of a 5.x static topic (RocketMQ's TopicQueueMappingInfo): which logical
    queues of the scope it hosts now, by their physical queue id there."""

    broker_name: str
    scope: str
    total_queues: int
    epoch: int
    logical_to_physical: Mapping[int, int]

    @property
    def logical_broker(self) -> str:
        """The broker name clients give the scope's logical queues (``getMockBrokerName``)."""
        scope = self.scope[2:] if self.scope == METADATA_SCOPE_GLOBAL else self.scope
        return LOGICAL_QUEUE_MOCK_BROKER_PREFIX + scope


@dataclass(frozen=True)
class TopicRouteData:
    """What a NameServer answers for a topic (RocketMQ's TopicRouteData)."""

    topic: str
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    order_topic_conf: str | None = None
    queue_mappings: tuple[QueueMapping, ...] = ()
    """``topicQueueMappingByBroker``: set only for a static (logical-queue) topic."""

    def broker(self, name: str) -> BrokerData | None:
        return next((b for b in self.broker_datas if b.broker_name == name), None)

    def to_topic_route(self, zones: Mapping[str, str] | None = None) -> TopicRoute:
        """The core model's route: one Broker per QueueData, sorted by broker name.

        Every QueueData is kept, as a consumer's ``topicRouteData2TopicSubscribeInfo`` keeps
        the readable ones whether or not the broker group has a master; a broker without one
        has ``has_master`` False, so producers skip it as ``topicRouteData2TopicPublishInfo`` does.
        A broker's zone is ``zones``' entry, else the zone it registered with, else unknown.
        """
        zones = {**self.registered_zones(), **(zones or {})}
        if self.queue_mappings:
            return TopicRoute(topic=self.topic, brokers=self._logical_brokers(zones))
        brokers = sorted(
            (
                Broker(
                    name=q.broker_name,
                    read_queue_nums=q.read_queue_nums,
                    write_queue_nums=q.write_queue_nums,
                    perm=q.perm,
                    has_master=self.has_master(q.broker_name),
                    **({"zone": zones[q.broker_name]} if q.broker_name in zones else {}),
                )
                for q in self.queue_datas
            ),
            key=lambda b: b.name,
        )
        return TopicRoute(topic=self.topic, brokers=tuple(brokers))

    def _logical_brokers(self, zones: Mapping[str, str]) -> tuple[Broker, ...]:
        """A static topic's route as its consumers see it (``topicRouteData2TopicSubscribeInfo``):
        one broker per scope, named ``__syslo__<scope>``, whose queues are the logical queues
        0..n-1, n the largest ``totalQueues`` any broker reports (``ClientMetadata.
        topicRouteData2EndpointsForStaticTopic``). A client reads and commits a logical queue at
        the broker hosting it now, so moving a logical queue between brokers changes nothing here.
        The logical broker has a master when every broker hosting its queues has one, and a zone
        when ``zones`` names it or all of those brokers registered the same one.
        """
        by_scope: dict[str, list[QueueMapping]] = {}
        for m in self.queue_mappings:
            by_scope.setdefault(m.logical_broker, []).append(m)
        perms = {q.broker_name: q.perm for q in self.queue_datas}
        brokers = []
        for name, mappings in sorted(by_scope.items()):
            hosts = sorted({m.broker_name for m in mappings})
            total = max(m.total_queues for m in mappings)
            perm = 0
            for host in hosts:
                perm |= perms.get(host, 0)
            host_zones = {zones.get(h) for h in hosts}
            zone = zones.get(name) or (host_zones.pop() if len(host_zones) == 1 else None)
            brokers.append(
                Broker(
                    name=name,
                    read_queue_nums=total,
                    write_queue_nums=total,
                    perm=perm,
                    has_master=all(self.has_master(h) for h in hosts),
                    **({"zone": zone} if zone else {}),
                )
            )
        return tuple(brokers)

    def registered_zones(self) -> dict[str, str]:
        """Broker name -> the zone it registered with, for the brokers that gave one."""
        return {b.broker_name: b.zone for b in self.broker_datas if b.zone}

    def has_master(self, broker_name: str) -> bool:
        b = self.broker(broker_name)
        return b is not None and b.master_address is not None

    def brokers_without_master(self) -> list[str]:
        """Broker names with queues but no master address: producers cannot send there."""
        return sorted(q.broker_name for q in self.queue_datas if not self.has_master(q.broker_name))

    @property
    def readable(self) -> bool:
        return any(q.perm & PERM_READ and q.read_queue_nums > 0 for q in self.queue_datas)

    @property
    def writable(self) -> bool:
        return any(q.perm & PERM_WRITE and q.write_queue_nums > 0 for q in self.queue_datas)


def decode_topic_route(topic: str, body: bytes) -> TopicRouteData:
    """The body of a successful GET_ROUTEINFO_BY_TOPIC response; FrameError for any other bytes."""
    document = parse_fastjson(body)
    if not isinstance(document, dict):
        raise FrameError(f"route of {topic!r} is not a JSON object: {body[:200]!r}")
    try:
        queues = tuple(
            QueueData(
                broker_name=str(q["brokerName"]),
                read_queue_nums=int(q["readQueueNums"]),
                write_queue_nums=int(q["writeQueueNums"]),
                perm=int(q["perm"]),
                topic_sys_flag=int(q.get("topicSysFlag", 0)),
            )
            for q in document.get("queueDatas") or []
        )
        brokers = tuple(_broker_data(b) for b in document.get("brokerDatas") or [])
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise FrameError(f"route of {topic!r} lacks or mistypes {exc}: {body[:300]!r}") from None
    conf = document.get("orderTopicConf")
    if not isinstance(conf, str | None):
        raise FrameError(f"route of {topic!r}: orderTopicConf is not a string: {body[:300]!r}")
    try:
        mappings = tuple(
            QueueMapping(
                broker_name=str(m.get("bname") or name),
                scope=str(m.get("scope") or METADATA_SCOPE_GLOBAL),
                total_queues=int(m.get("totalQueues", 0)),
                epoch=int(m.get("epoch", 0)),
                logical_to_physical={int(k): int(v) for k, v in (m.get("currIdMap") or {}).items()},
            )
            for name, m in sorted((document.get("topicQueueMappingByBroker") or {}).items())
        )
    except (AttributeError, TypeError, ValueError, OverflowError) as exc:
        raise FrameError(f"route of {topic!r}: bad topicQueueMappingByBroker {exc}: {body[:300]!r}") from None
    return TopicRouteData(
        topic=topic, queue_datas=queues, broker_datas=brokers, order_topic_conf=conf, queue_mappings=mappings
    )


def _broker_data(document: Mapping[str, Any]) -> BrokerData:
    return BrokerData(
        broker_name=str(document["brokerName"]),
        cluster=str(document.get("cluster", "")),
        addresses={int(k): str(v) for k, v in (document.get("brokerAddrs") or {}).items()},
        zone=str(document["zoneName"]) if document.get("zoneName") else None,
    )


@dataclass(frozen=True)
class ClusterInfo:
    """What a NameServer answers to GET_BROKER_CLUSTER_INFO (RocketMQ's ClusterInfo)."""

    brokers: Mapping[str, BrokerData]
    clusters: Mapping[str, tuple[str, ...]]


def decode_cluster_info(body: bytes) -> ClusterInfo:
    """The body of a successful GET_BROKER_CLUSTER_INFO response; FrameError for any other bytes."""
    document = parse_fastjson(body)
    try:
        brokers = {str(k): _broker_data(v) for k, v in (document.get("brokerAddrTable") or {}).items()}
        clusters = {str(k): tuple(sorted(v)) for k, v in (document.get("clusterAddrTable") or {}).items()}
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise FrameError(f"cluster info lacks or mistypes {exc}: {body[:300]!r}") from None
    return ClusterInfo(brokers=brokers, clusters=clusters)
