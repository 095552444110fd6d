"""Reading Topic and ConsumerGroup specs into core types.

The CRD schemas reject most bad input at admission, and on Kubernetes 1.28 and later
their CEL rules reject the selector, CONFIG, MACHINE_ROOM, handover lease and name-length
mistakes below too. This module checks all of it again, since older servers (1.20) drop the rules, plus
what only makes sense against other objects, with messages that say what to fix. It also fills in the
schema's defaults, so objects created before a default existed read the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import MAX_GROUP_NAME, HandoverSpec, SpecError, read_handover, read_strategy
from mqbalance.contract.bounds import MAX_MIN_READY_SECONDS, check_topics
from mqbalance.model import MessageModel, StrategySpec, TopicRoute

DEFAULT_ZONE_LABEL = "topology.kubernetes.io/zone"
DEFAULT_DEBOUNCE_SECONDS = 2.0
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


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
    handover: HandoverSpec = field(default_factory=HandoverSpec)
    min_ready_seconds: int = 0
    """How long a pod must have been Ready before it is given queues (longer after restarts)."""


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
    check_topics(len(topics))
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
    min_ready = spec.get("minReadySeconds", 0)
    if (
        not isinstance(min_ready, int)
        or isinstance(min_ready, bool)
        or not 0 <= min_ready <= MAX_MIN_READY_SECONDS
    ):
        raise SpecError(
            f"spec.minReadySeconds is {min_ready!r}; use whole seconds from 0 to {MAX_MIN_READY_SECONDS}"
        )
    handover = read_handover(spec.get("handover") or {}, model)
    group_name = spec.get("groupName") or resource_name
    return GroupSpec(
        group_name=group_name,
        topics=tuple(topics),
        selector=parse_selector(spec.get("selector")),
        message_model=model,
        strategy=read_strategy(spec.get("strategy") or {}, model),
        zone_label=zone_label,
        debounce_seconds=float(debounce),
        handover=handover,
        min_ready_seconds=min_ready,
    )


def subscribed_topics(spec: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The names ``spec.topics`` lists, read even when the spec is invalid: a Topic named there
    may be what makes the group valid again."""
    topics = spec.get("topics") if isinstance(spec, Mapping) else None
    return tuple(t for t in topics if isinstance(t, str)) if isinstance(topics, list) else ()


def selector_or_none(spec: Mapping[str, Any] | None) -> LabelSelector | None:
    """``spec.selector``, to narrow the pods looked at; None (every pod) when it does not parse."""
    try:
        return parse_selector(spec.get("selector") if isinstance(spec, Mapping) else None)
    except SpecError:
        return None


def unknown_config_queues(strategy: StrategySpec, routes: Mapping[str, TopicRoute]) -> list[str]:
    """CONFIG queues (``broker/queueId``) that no subscribed topic has as a readable queue."""
    if not strategy.config:
        return []
    present = {(mq.broker_name, mq.queue_id) for r in routes.values() for mq in r.readable_queues()}
    return sorted(
        {
            f"{mq.broker_name}/{mq.queue_id}"
            for queues in strategy.config.values()
            for mq in queues
            if (mq.broker_name, mq.queue_id) not in present
        }
    )
