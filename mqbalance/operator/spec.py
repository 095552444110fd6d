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

from mqbalance.contract import MAX_GROUP_NAME, SpecError, read_strategy
from mqbalance.model import MessageModel, StrategySpec, TopicRoute
from mqbalance.operator.handover import (
    DEFAULT_BROKER_LOCK,
    DEFAULT_LEASE,
    DEFAULT_LEASE_MARGIN,
    DEFAULT_RELEASE_TIMEOUT,
    DEFAULT_RENEW,
    HandoverMode,
    HandoverSpec,
)

DEFAULT_ZONE_LABEL = "topology.kubernetes.io/zone"
DEFAULT_DEBOUNCE_SECONDS = 2.0
LEASE_RENEWALS = 2
"""spec.handover.leaseSeconds must be at least this many renewSeconds (a renewal may fail or be late)."""
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
    handover = parse_handover(spec.get("handover") or {}, model)
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
    )


def parse_handover(data: Any, model: MessageModel) -> HandoverSpec:
    """``spec.handover``: how queues change owner (Off, the default, keeps the one-step hand-over)."""
    if not isinstance(data, Mapping):
        raise SpecError("spec.handover must be an object with a mode (Off, Release or Orderly)")
    try:
        mode = HandoverMode(data.get("mode") or HandoverMode.OFF)
    except ValueError:
        raise SpecError(f"spec.handover.mode is {data.get('mode')!r}; use Off, Release or Orderly") from None
    if mode is not HandoverMode.OFF and model is MessageModel.BROADCASTING:
        raise SpecError(
            "spec.handover.mode applies to CLUSTERING only (in BROADCASTING every member holds every queue); "
            "set it to Off"
        )
    values = []
    for key, default, low, high in (
        ("releaseTimeoutSeconds", DEFAULT_RELEASE_TIMEOUT, 1, 3600),
        ("brokerLockSeconds", DEFAULT_BROKER_LOCK, 0, 3600),
        ("leaseSeconds", DEFAULT_LEASE, 1, 3600),
        ("renewSeconds", DEFAULT_RENEW, 1, 1800),
    ):
        value = data.get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
            raise SpecError(
                f"spec.handover.{key} is {value!r}; use a number of seconds from {low:g} to {high}"
            )
        values.append(float(value))
    timeout, lock, lease, renew = values
    margin = data.get("leaseMarginSeconds", DEFAULT_LEASE_MARGIN)
    if not isinstance(margin, int | float) or isinstance(margin, bool) or not 0 < margin <= 600:
        raise SpecError(
            f"spec.handover.leaseMarginSeconds is {margin!r}; use a number of seconds more than 0 and "
            "at most 600: it covers the drift between the operator's and the sidecars' clocks (5 by default)"
        )
    if lease < LEASE_RENEWALS * renew:
        raise SpecError(
            f"spec.handover.leaseSeconds ({lease:g}) must be at least {LEASE_RENEWALS} x renewSeconds "
            f"({renew:g}), so that one late or failed renewal does not stop a healthy member: "
            f"raise leaseSeconds to {LEASE_RENEWALS * renew:g} or more, or lower renewSeconds"
        )
    return HandoverSpec(mode, timeout, lock, lease, renew, float(margin))


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
