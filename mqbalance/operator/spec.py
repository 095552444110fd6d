"""Reading Topic and ConsumerGroup specs into core types.

The CRD schemas reject most bad input at admission, and on Kubernetes 1.28 and later
their CEL rules reject the selector, CONFIG, MACHINE_ROOM and name-length mistakes below
too. This module checks all of it again, since older servers (1.20) drop the rules, plus
what only makes sense against other objects, with messages that say what to fix. It also fills in the
schema's defaults, so objects created before a default existed read the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mqbalance.model import (
    PERM_READ_WRITE,
    UNKNOWN_ZONE,
    Broker,
    MessageModel,
    MessageQueue,
    StrategyName,
    StrategySpec,
    TopicRoute,
)

DEFAULT_ZONE_LABEL = "topology.kubernetes.io/zone"
MAX_GROUP_NAME = 63
"""Longest ConsumerGroup resource name: a label value."""
DEFAULT_DEBOUNCE_SECONDS = 2.0
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SpecError(ValueError):
    """A spec the operator cannot honour; the message names the field and the fix."""


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        # NotIn matches objects without the label, as in Kubernetes.
        return self.key not in labels or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes label selector. The empty selector matches every object, as in Kubernetes."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


@dataclass(frozen=True)
class GroupSpec:
    """A ConsumerGroup's spec, defaults filled in."""

    group_name: str
    """The RocketMQ consumer group name."""
    topics: tuple[str, ...]
    """Names of the Topic resources subscribed, in the same namespace."""
    selector: LabelSelector
    message_model: MessageModel
    strategy: StrategySpec
    zone_label: str = DEFAULT_ZONE_LABEL
    debounce_seconds: float = DEFAULT_DEBOUNCE_SECONDS


def parse_selector(data: Any, where: str = "spec.selector") -> LabelSelector:
    if data is None:
        raise SpecError(
            f"{where} is missing; give matchLabels or matchExpressions that select the member pods"
        )
    if not isinstance(data, Mapping):
        raise SpecError(f"{where} must be an object with matchLabels and/or matchExpressions")
    labels = data.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise SpecError(f"{where}.matchLabels must map label keys to string values")
    requirements = []
    for i, expr in enumerate(data.get("matchExpressions") or []):
        at = f"{where}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping) or not isinstance(expr.get("key"), str) or not expr.get("key"):
            raise SpecError(f"{at} needs a non-empty key")
        op = expr.get("operator")
        if op not in SELECTOR_OPERATORS:
            raise SpecError(f"{at}.operator is {op!r}; use one of {', '.join(SELECTOR_OPERATORS)}")
        values = expr.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SpecError(f"{at}.values must be a list of strings")
        if op in ("In", "NotIn") and not values:
            raise SpecError(f"{at}: operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise SpecError(f"{at}: operator {op} takes no values; remove them")
        requirements.append(Requirement(expr["key"], op, frozenset(values)))
    return LabelSelector(dict(labels), tuple(requirements))


def parse_topic(resource_name: str, spec: Mapping[str, Any] | None) -> TopicRoute:
    """A Topic resource's spec as a route. Broker zones left empty are UNKNOWN_ZONE."""
    where = f"Topic {resource_name!r}"
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where} has no spec")
    brokers_raw = spec.get("brokers")
    if not isinstance(brokers_raw, list) or not brokers_raw:
        raise SpecError(f"{where}: spec.brokers must list at least one broker")
    brokers: list[Broker] = []
    seen: set[str] = set()
    for i, b in enumerate(brokers_raw):
        at = f"{where}: spec.brokers[{i}]"
        if not isinstance(b, Mapping) or not isinstance(b.get("name"), str) or not b["name"]:
            raise SpecError(f"{at} needs a name")
        if b["name"] in seen:
            raise SpecError(f"{at}: broker {b['name']!r} is listed twice; merge the entries")
        seen.add(b["name"])
        counts = []
        for key in ("readQueueNums", "writeQueueNums"):
            value = b.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SpecError(f"{at}.{key} must be an integer of 0 or more, got {value!r}")
            counts.append(value)
        perm = b.get("perm", PERM_READ_WRITE)
        # Any PermName bit combination, as the CRD admits (7 is TBW102's read-write-inherit).
        if not isinstance(perm, int) or isinstance(perm, bool) or not 0 <= perm <= 15:
            raise SpecError(
                f"{at}.perm is {perm!r}; use PermName bits 0-15: 6 read-write, 4 read-only, 2 write-only"
            )
        brokers.append(Broker(b["name"], counts[0], counts[1], perm, b.get("zone") or UNKNOWN_ZONE))
    return TopicRoute(topic_name(resource_name, spec), tuple(brokers))


def topic_name(resource_name: str, spec: Mapping[str, Any]) -> str:
    """The RocketMQ topic name: ``spec.topicName``, or the resource name when empty."""
    name = spec.get("topicName")
    return name if isinstance(name, str) and name else resource_name


def parse_group(resource_name: str, spec: Mapping[str, Any] | None) -> GroupSpec:
    """A ConsumerGroup resource's spec; raises SpecError naming the field to fix."""
    if not isinstance(spec, Mapping):
        raise SpecError("the ConsumerGroup has no spec")
    if len(resource_name) > MAX_GROUP_NAME:
        # The name is the value of the ConfigMap's mqbalance.io/group label; the API server
        # would refuse every write of the ConfigMap.
        raise SpecError(
            f"the ConsumerGroup's name is {len(resource_name)} characters; it becomes a label value on "
            f"its ConfigMap, which may hold at most {MAX_GROUP_NAME}: recreate the group with a shorter name "
            "(spec.groupName keeps the RocketMQ name)"
        )
    topics = spec.get("topics")
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics):
        raise SpecError("spec.topics must list the names of one or more Topic resources in this namespace")
    if len(set(topics)) != len(topics):
        raise SpecError("spec.topics names a Topic twice; list each once")
    try:
        model = MessageModel(spec.get("messageModel") or MessageModel.CLUSTERING)
    except ValueError:
        raise SpecError(
            f"spec.messageModel is {spec.get('messageModel')!r}; use CLUSTERING or BROADCASTING"
        ) from None
    zone_label = spec.get("zoneLabel") or DEFAULT_ZONE_LABEL
    if not isinstance(zone_label, str):
        raise SpecError("spec.zoneLabel must be a node label key")
    debounce = spec.get("debounceSeconds", DEFAULT_DEBOUNCE_SECONDS)
    if not isinstance(debounce, int | float) or isinstance(debounce, bool) or not 0 <= debounce <= 600:
        raise SpecError(f"spec.debounceSeconds is {debounce!r}; use a number of seconds from 0 to 600")
    group_name = spec.get("groupName") or resource_name
    return GroupSpec(
        group_name=group_name,
        topics=tuple(topics),
        selector=parse_selector(spec.get("selector")),
        message_model=model,
        strategy=parse_strategy(spec.get("strategy") or {}, model),
        zone_label=zone_label,
        debounce_seconds=float(debounce),
    )


def parse_strategy(data: Mapping[str, Any], model: MessageModel) -> StrategySpec:
    if not isinstance(data, Mapping):
        raise SpecError("spec.strategy must be an object with a name and its parameters")
    name = _strategy_name(data.get("name") or StrategyName.AVG, "spec.strategy.name")
    inner = _strategy_name(data.get("inner") or StrategyName.AVG, "spec.strategy.inner")
    if inner not in (StrategyName.AVG, StrategyName.AVG_BY_CIRCLE, StrategyName.CONSISTENT_HASH):
        raise SpecError(f"spec.strategy.inner is {inner}; use AVG, AVG_BY_CIRCLE or CONSISTENT_HASH")
    virtual_nodes = data.get("virtualNodes", 10)
    if not isinstance(virtual_nodes, int) or isinstance(virtual_nodes, bool) or virtual_nodes < 1:
        raise SpecError(
            f"spec.strategy.virtualNodes is {virtual_nodes!r}; use a positive integer (default 10)"
        )
    idcs = data.get("consumerIdcs") or []
    if not isinstance(idcs, list) or not all(isinstance(i, str) and i for i in idcs):
        raise SpecError("spec.strategy.consumerIdcs must be a list of idc names")
    if name is StrategyName.MACHINE_ROOM and not idcs:
        raise SpecError(
            "strategy MACHINE_ROOM needs spec.strategy.consumerIdcs: list the idcs (the part before '@' "
            "in broker names) this group consumes"
        )
    config = _parse_config(data.get("config") or {}, model) if name is StrategyName.CONFIG else {}
    if name is StrategyName.CONFIG and not config:
        raise SpecError("strategy CONFIG needs spec.strategy.config: map member pod names to their queues")
    return StrategySpec(
        name=name,
        virtual_nodes=virtual_nodes,
        inner=inner,
        consumer_idcs=frozenset(idcs),
        config=config,
        zone_affinity=bool(data.get("zoneAffinity", False)),
    )


def _parse_config(data: Any, model: MessageModel) -> dict[str, tuple[MessageQueue, ...]]:
    """CONFIG's ``member -> [{broker, queueId}]``; queues carry no topic, so they match in every topic."""
    if not isinstance(data, Mapping):
        raise SpecError("spec.strategy.config must map member pod names to lists of {broker, queueId}")
    out: dict[str, tuple[MessageQueue, ...]] = {}
    holder: dict[MessageQueue, str] = {}
    for member, queues in sorted(data.items()):
        if not isinstance(queues, list):
            raise SpecError(f"spec.strategy.config[{member!r}] must be a list of {{broker, queueId}}")
        parsed = []
        for i, q in enumerate(queues):
            at = f"spec.strategy.config[{member!r}][{i}]"
            if not isinstance(q, Mapping) or not isinstance(q.get("broker"), str) or not q["broker"]:
                raise SpecError(f"{at} needs a broker name")
            qid = q.get("queueId")
            if not isinstance(qid, int) or isinstance(qid, bool) or qid < 0:
                raise SpecError(f"{at}.queueId must be an integer of 0 or more")
            mq = MessageQueue("", q["broker"], qid)
            if model is MessageModel.CLUSTERING and holder.setdefault(mq, member) != member:
                raise SpecError(
                    f"spec.strategy.config gives queue {q['broker']}/{qid} to both {holder[mq]!r} and "
                    f"{member!r}; in CLUSTERING every queue has one owner, so keep it under one member"
                )
            parsed.append(mq)
        out[str(member)] = tuple(parsed)
    return out


def unknown_config_queues(strategy: StrategySpec, routes: Mapping[str, TopicRoute]) -> list[str]:
    """CONFIG queues (``broker/queueId``) that no subscribed topic has as a readable queue."""
    present = {(mq.broker_name, mq.queue_id) for r in routes.values() for mq in r.readable_queues()}
    return sorted(
        {
            f"{mq.broker_name}/{mq.queue_id}"
            for queues in strategy.config.values()
            for mq in queues
            if (mq.broker_name, mq.queue_id) not in present
        }
    )


def _strategy_name(value: Any, where: str) -> StrategyName:
    try:
        return StrategyName(value)
    except ValueError:
        raise SpecError(f"{where} is {value!r}; use one of {', '.join(StrategyName)}") from None
