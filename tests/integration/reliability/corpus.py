"""A corpus of malformed and hostile Topic and ConsumerGroup objects, each with its expected fate.

Most cases come from a compact table: a field path in a valid base object and the bad values to
put there. Hand-written cases follow for what a path and a value cannot say (several fields at
once, references between objects, deep junk). Fates:

- ``rejected``: the API server answers 422 at admission, naming ``where``;
- ``invalid:<Reason>``: accepted; the group (for a Topic: a probe group subscribing it) reports
  condition Invalid=True with that reason and a message;
- ``not-ready:<Reason>``: accepted and valid; the group reports Ready=False with that reason;
- ``served``: accepted and served (Ready=True), e.g. unknown fields the schema prunes.

A case's fate is the one on the current API server; ``legacy_fate`` says where 1.20 differs:

- the CRDs' CEL rules (x-kubernetes-validations) reject at admission what the operator would
  report as Invalid, with the rule's message; 1.20 drops the rules, so the operator reports it;
- the 1.20 API server turns an empty string in a custom object into null before validation, so
  "" in any string field is rejected (``must be string``) even where the schema allows it: a
  Topic broker's ``zone: ""`` cannot mean "unknown" there; leave the field out instead.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

PROBE_LABELS = {"probe": "yes"}
DEEP = 60

# The messages of the CRDs' CEL rules (crds/mqbalance.io_consumergroups.yaml), as the 422 quotes them.
MACHINE_ROOM_NEEDS_IDCS = "strategy MACHINE_ROOM needs spec.strategy.consumerIdcs: list the idcs"
CONFIG_NEEDS_MAP = "strategy CONFIG needs spec.strategy.config: map member pod names to their queues"
VALUES_NEEDED = "operators In and NotIn need at least one value in values"
NO_VALUES = "operators Exists and DoesNotExist take no values; remove values"
NAME_TOO_LONG = "metadata.name may have at most 63 characters"
LEASE_TOO_SHORT = "spec.handover.leaseSeconds must be at least 2 x renewSeconds"
LOAD_NEEDS_STICKY = "spec.strategy.load balances measured traffic and only STICKY takes it"
# crds/mqbalance.io_topics.yaml
TOPIC_NEEDS_COUNTS = "without spec.nameServer, spec.brokers must list every broker with readQueueNums"
READ_OVER_BOUND = "the brokers' readQueueNums add up to more than 4096, the bound of queues per topic"
WRITE_OVER_BOUND = "the brokers' writeQueueNums add up to more than 4096, the bound of queues per topic"


@dataclass(frozen=True)
class Case:
    kind: str
    """``Topic`` or ``ConsumerGroup``."""
    name: str
    spec: Any
    fate: str
    where: str = ""
    """For ``rejected``: the field path the 422 message names."""
    resource_name: str | None = None
    """metadata.name when the case is about the name itself."""
    note: str = ""
    message: str = ""
    """For ``rejected``: text the 422 must contain (a CEL rule's message)."""
    legacy_fate: str | None = None
    """The fate on Kubernetes 1.20 when it differs (see the module's docstring)."""

    def on(self, legacy: bool) -> Case:
        """The case as the given server version treats it."""
        if not legacy or self.legacy_fate is None:
            return self
        return replace(self, fate=self.legacy_fate, message="", legacy_fate=None)


def cel_rejected(where: str, message: str, legacy_fate: str = "invalid:InvalidSpec") -> dict[str, str]:
    """Fields of a case the current server's CEL rules reject and 1.20's operator reports: as the
    group's InvalidSpec, or for a Topic as InvalidTopic of the probe group that subscribes it."""
    return {"fate": "rejected", "where": where, "message": message, "legacy_fate": legacy_fate}


def base_topic() -> dict[str, Any]:
    return {
        "brokers": [
            {"name": "broker-a", "zone": "zone-a", "readQueueNums": 4, "writeQueueNums": 4},
            {"name": "broker-b", "readQueueNums": 4, "writeQueueNums": 4},
        ]
    }


def base_group() -> dict[str, Any]:
    return {"topics": ["orders"], "selector": {"matchLabels": dict(PROBE_LABELS)}, "debounceSeconds": 0}


def _deep(depth: int) -> Any:
    junk: Any = "bottom"
    for i in range(depth):
        junk = {f"k{i}": [junk, i, None, "🦀"]}
    return junk


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``obj`` with ``value`` at a dotted path (``a.b[0].c``); ``...`` deletes the field."""
    out = copy.deepcopy(obj)
    parts: list[str | int] = []
    for part in path.split("."):
        name, _, index = part.partition("[")
        parts.append(name)
        if index:
            parts.append(int(index.rstrip("]")))
    target: Any = out
    for key in parts[:-1]:
        if isinstance(key, str) and isinstance(target, dict) and key not in target:
            target[key] = {}
        target = target[key]
    if value is ...:
        del target[parts[-1]]
    else:
        target[parts[-1]] = value
    return out


# path in the base object -> bad values the schema must reject
TOPIC_REJECT: dict[str, list[Any]] = {
    "brokers": [
        [],
        "broker-a",
        {"name": "x"},
        [None],
        [1],
        [{"name": f"b{i}", "readQueueNums": 1, "writeQueueNums": 1} for i in range(65)],
    ],
    "brokers[0].readQueueNums": [-1, 1025, 2**40, "8", 1.5, True],
    "brokers[0].writeQueueNums": [-1, 1025, "x", 3.25],
    "brokers[0].perm": [16, -1, "6", 6.5],
    "brokers[0].name": ["", "has space", "x" * 128, "ünïcode", "a/b", None, 42, ...],
    "brokers[0].zone": ["z" * 64, 7, ["zone-a"]],
    "topicName": ["has space", "t" * 128, "topic/with/slash", "日本", 1],
    "nameServer": ["10.0.0.5:9876", [], 1],
    "nameServer.addresses": ["10.0.0.5:9876", ["10.0.0.5"], ["a:9876;b:9876"], ["has space:9876"], [1]],
    "nameServer.pollSeconds": [0, 4, 3601, "30", 1.5],
}
GROUP_REJECT: dict[str, list[Any]] = {
    "topics": [
        [],
        "orders",
        [1],
        [""],
        ["UPPER"],
        ["a" * 254],
        [f"t{i}" for i in range(65)],
        [None],
        ["orders", "orders"],
        ["-bad"],
        ...,
    ],
    "selector": [..., "app=x", [], None],
    "selector.matchLabels": ["app", {"app": 1}, ["app"]],
    "selector.matchExpressions": [
        {"key": "a"},
        [{"operator": "In"}],
        [{"key": "a", "operator": "Like"}],
        [{"key": "a", "operator": "In", "values": [1]}],
        [{"key": "", "operator": "Exists"}],
        ["In"],
    ],
    "messageModel": ["CLUSTER", "clustering", 1, "", "BROADCAST"],
    "strategy": ["AVG", ["AVG"], 1],
    "strategy.name": ["ROUND_ROBIN", "avg", "", 7, "AVG "],
    "strategy.virtualNodes": [0, -1, 1001, 10**12, "10", 1.5],
    "strategy.inner": ["STICKY", "CONFIG", "x"],
    "strategy.consumerIdcs": ["hz", [""], [f"i{i}" for i in range(65)], ["x" * 64], [3]],
    "strategy.config": [
        "x",
        {"p": "x"},
        {"p": [{"broker": "b"}]},
        {"p": [{"broker": "b", "queueId": -1}]},
        {"p": [{"broker": "b", "queueId": "1"}]},
        {"p": [{"queueId": 1}]},
        {"p": [{"broker": "", "queueId": 1}]},
    ],
    "strategy.zoneAffinity": ["yes", 1],
    "strategy.load": ["x", 3],
    "strategy.load.tolerance": [-0.1, 11, "0.2"],
    "strategy.load.samples": [0, 1001, 1.5, "3"],
    "strategy.load.maxQueueFactor": [0.5, 101],
    "zoneLabel": ["", "l" * 317, 5],
    "debounceSeconds": [-1, 601, "2", True, 1e308, -0.001],
    "groupName": ["has space", "g" * 256, "ünïcode", "a/b"],
    "handover.leaseSeconds": [0, 3601, "20", True],
    "handover.renewSeconds": [0, 0.25, 1801, "5"],
    "handover.leaseMarginSeconds": [0, -1, 601, "5"],
}


def generated() -> list[Case]:
    cases = []
    for kind, table, base in (
        ("Topic", TOPIC_REJECT, base_topic),
        ("ConsumerGroup", GROUP_REJECT, base_group),
    ):
        for path, values in table.items():
            for value in values:
                cases.append(
                    Case(
                        kind, f"{path}={_short(value)}", _set(base(), path, value), "rejected", f"spec.{path}"
                    )
                )
    return cases


def hand_written() -> list[Case]:
    long_name = "n" * 254
    return [
        # Names: the API server's own validation.
        Case("ConsumerGroup", "name too long", base_group(), "rejected", "metadata.name", long_name),
        Case("ConsumerGroup", "name uppercase", base_group(), "rejected", "metadata.name", "Orders"),
        Case("Topic", "name unicode", base_topic(), "rejected", "metadata.name", "tópico"),
        Case("ConsumerGroup", "no spec", None, "rejected", "spec"),
        Case("Topic", "spec not an object", "brokers", "rejected", "spec"),
        # Accepted by the schema, caught by the operator.
        Case(
            "ConsumerGroup", "missing topic", {**base_group(), "topics": ["nowhere"]}, "invalid:TopicNotFound"
        ),
        Case(
            "ConsumerGroup",
            "one missing of two",
            {**base_group(), "topics": ["orders", "nowhere"]},
            "invalid:TopicNotFound",
        ),
        Case(
            "Topic",
            "broker listed twice",
            {"brokers": [*base_topic()["brokers"], {**base_topic()["brokers"][0]}]},
            "rejected",
            "spec.brokers[2]",
        ),
        # Rejected by the CEL rules of the current server, reported by the operator on 1.20.
        Case(
            "Topic",
            "no brokers and no nameServer",
            {"topicName": "orders"},
            **cel_rejected("spec.brokers", TOPIC_NEEDS_COUNTS, "invalid:InvalidTopic"),
        ),
        Case(
            "Topic",
            "a broker without readQueueNums, no nameServer",
            _set(base_topic(), "brokers[0].readQueueNums", ...),
            **cel_rejected("spec.brokers", TOPIC_NEEDS_COUNTS, "invalid:InvalidTopic"),
        ),
        Case(
            "Topic",
            "a broker with readQueueNums null (dropped, so missing), no nameServer",
            _set(base_topic(), "brokers[0].readQueueNums", None),
            **cel_rejected("spec.brokers", TOPIC_NEEDS_COUNTS, "invalid:InvalidTopic"),
        ),
        Case(
            "Topic",
            "a broker without writeQueueNums, no nameServer",
            _set(base_topic(), "brokers[1].writeQueueNums", ...),
            **cel_rejected("spec.brokers", TOPIC_NEEDS_COUNTS, "invalid:InvalidTopic"),
        ),
        Case(
            "ConsumerGroup",
            "MACHINE_ROOM without idcs",
            {**base_group(), "strategy": {"name": "MACHINE_ROOM"}},
            **cel_rejected("spec.strategy.consumerIdcs", MACHINE_ROOM_NEEDS_IDCS),
        ),
        Case(
            "ConsumerGroup",
            "MACHINE_ROOM with no idcs",
            {**base_group(), "strategy": {"name": "MACHINE_ROOM", "consumerIdcs": []}},
            **cel_rejected("spec.strategy.consumerIdcs", MACHINE_ROOM_NEEDS_IDCS),
        ),
        Case(
            "ConsumerGroup",
            "load on AVG",
            {**base_group(), "strategy": {"name": "AVG", "load": {}}},
            **cel_rejected("spec.strategy.load", LOAD_NEEDS_STICKY),
        ),
        Case(
            "ConsumerGroup",
            "STICKY with load",
            {**base_group(), "strategy": {"name": "STICKY", "load": {"tolerance": 0.5, "samples": 1}}},
            "served",
        ),
        Case(
            "ConsumerGroup",
            "CONFIG without map",
            {**base_group(), "strategy": {"name": "CONFIG"}},
            **cel_rejected("spec.strategy.config", CONFIG_NEEDS_MAP),
        ),
        Case(
            "ConsumerGroup",
            "CONFIG with an empty map",
            {**base_group(), "strategy": {"name": "CONFIG", "config": {}}},
            **cel_rejected("spec.strategy.config", CONFIG_NEEDS_MAP),
        ),
        Case(
            "ConsumerGroup",
            "CONFIG one queue two owners",
            {
                **base_group(),
                "strategy": {
                    "name": "CONFIG",
                    "config": {
                        "probe-0": [{"broker": "broker-a", "queueId": 0}],
                        "probe-1": [{"broker": "broker-a", "queueId": 0}],
                    },
                },
            },
            "invalid:InvalidSpec",
        ),
        Case(
            "ConsumerGroup",
            "In without values",
            {**base_group(), "selector": {"matchExpressions": [{"key": "probe", "operator": "In"}]}},
            **cel_rejected("spec.selector.matchExpressions[0].values", VALUES_NEEDED),
        ),
        Case(
            "ConsumerGroup",
            "NotIn with no values",
            {
                **base_group(),
                "selector": {"matchExpressions": [{"key": "probe", "operator": "NotIn", "values": []}]},
            },
            **cel_rejected("spec.selector.matchExpressions[0].values", VALUES_NEEDED),
        ),
        Case(
            "ConsumerGroup",
            "Exists with values",
            {
                "topics": ["orders"],
                "selector": {"matchExpressions": [{"key": "probe", "operator": "Exists", "values": ["yes"]}]},
            },
            **cel_rejected("spec.selector.matchExpressions[0].values", NO_VALUES),
        ),
        Case(
            "ConsumerGroup",
            "DoesNotExist with values",
            {
                "topics": ["orders"],
                "selector": {
                    "matchExpressions": [
                        {"key": "probe", "operator": "Exists"},
                        {"key": "app", "operator": "DoesNotExist", "values": ["x"]},
                    ]
                },
            },
            **cel_rejected("spec.selector.matchExpressions[1].values", NO_VALUES),
        ),
        Case(
            "ConsumerGroup",
            "name longer than a label value",
            base_group(),
            resource_name="g" * 64,
            note="the group name is the ConfigMap's mqbalance.io/group label value (at most 63 characters)",
            **cel_rejected("metadata.name", NAME_TOO_LONG),
        ),
        Case(
            "ConsumerGroup", "name as long as a label value", base_group(), "served", resource_name="g" * 63
        ),
        # Time-bounded ownership: a grant must outlive one late or failed renewal.
        Case(
            "ConsumerGroup",
            "lease shorter than two renewals",
            _set(base_group(), "handover", {"mode": "Release", "leaseSeconds": 9, "renewSeconds": 5}),
            note="renewSeconds must be at most half of leaseSeconds",
            **cel_rejected("spec.handover.leaseSeconds", LEASE_TOO_SHORT),
        ),
        Case(
            "ConsumerGroup",
            "lease shorter than two default renewals",
            _set(base_group(), "handover", {"mode": "Orderly", "leaseSeconds": 6}),
            note="the default renewSeconds (5) is filled in before the rule is checked",
            **cel_rejected("spec.handover.leaseSeconds", LEASE_TOO_SHORT),
        ),
        Case(
            "ConsumerGroup",
            "lease exactly two renewals",
            _set(base_group(), "handover", {"mode": "Release", "leaseSeconds": 2, "renewSeconds": 1}),
            "served",
        ),
        # An empty string: 1.20 reads it as null and rejects it; the current server keeps it.
        Case(
            "Topic",
            "empty zone",
            _set(base_topic(), "brokers[0].zone", ""),
            "served",
            legacy_fate="rejected",
            where="spec.brokers[0].zone",
            note="'' is the unknown zone, as when zone is left out",
        ),
        Case(
            "Topic",
            "empty topicName",
            {**base_topic(), "topicName": ""},
            "served",
            legacy_fate="rejected",
            where="spec.topicName",
            note="'' means the resource name, as when topicName is left out",
        ),
        # Valid but serving nothing, reported in status.
        Case(
            "ConsumerGroup",
            "selector matches nothing",
            {**base_group(), "selector": {"matchLabels": {"app": "nobody"}}},
            "not-ready:NoMembers",
        ),
        Case(
            "ConsumerGroup",
            "unicode selector value",
            {**base_group(), "selector": {"matchLabels": {"app": "ünïcode-🦀"}}},
            "not-ready:NoMembers",
        ),
        Case(
            "ConsumerGroup",
            "NotIn everything",
            {
                "topics": ["orders"],
                "selector": {
                    "matchExpressions": [
                        {"key": "probe", "operator": "DoesNotExist"},
                        {"key": "app", "operator": "In", "values": ["ghost"]},
                    ]
                },
            },
            "not-ready:NoMembers",
        ),
        Case(
            "ConsumerGroup",
            "CONFIG naming pods and queues that do not exist",
            {
                **base_group(),
                "strategy": {
                    "name": "CONFIG",
                    "config": {"ghost-pod": [{"broker": "ghost-broker", "queueId": 99}]},
                },
            },
            "served",
            note="valid: the probe member gets no queues; Degraded names the missing queue",
        ),
        # Accepted, pruned or harmless: the group is served.
        Case(
            "ConsumerGroup",
            "null label value",
            {**base_group(), "selector": {"matchLabels": {"app": None, **PROBE_LABELS}}},
            "served",
            note="the API server drops a null map value: matchLabels {app: null} alone selects every pod",
        ),
        Case(
            "Topic",
            "null perm",
            {"brokers": [{"name": "b", "readQueueNums": 2, "writeQueueNums": 2, "perm": None}]},
            "served",
            note="the API server replaces null with the schema default (6)",
        ),
        Case("ConsumerGroup", "deeply nested unknown field", {**base_group(), "junk": _deep(DEEP)}, "served"),
        Case(
            "ConsumerGroup",
            "unknown strategy parameters",
            {**base_group(), "strategy": {"name": "STICKY", "weights": {"a": [1, 2, {"b": None}]}}},
            "served",
        ),
        Case("ConsumerGroup", "debounce maximum", {**base_group(), "debounceSeconds": 600}, "served"),
        Case(
            "ConsumerGroup",
            "max virtual nodes",
            {**base_group(), "strategy": {"name": "CONSISTENT_HASH", "virtualNodes": 1000}},
            "served",
        ),
        Case("Topic", "deeply nested unknown field", {**base_topic(), "junk": _deep(DEEP)}, "served"),
        # The bounds on a route (docs/operator.md, Bounds): each broker within 1024 queues, the whole
        # route over 4096 read or write queues.
        Case(
            "Topic",
            "huge: 64 brokers of 1024 queues",
            {
                "brokers": [
                    {"name": f"b{i}", "readQueueNums": 1024, "writeQueueNums": 1024} for i in range(64)
                ]
            },
            **cel_rejected("spec.brokers", READ_OVER_BOUND, "invalid:RouteTooLarge"),
        ),
        Case(
            "Topic",
            "write queues over the bound",
            {"brokers": [{"name": f"b{i}", "readQueueNums": 1, "writeQueueNums": 1024} for i in range(5)]},
            **cel_rejected("spec.brokers", WRITE_OVER_BOUND, "invalid:RouteTooLarge"),
        ),
        Case(
            "Topic",
            "at the bound: 64 brokers of 64 queues",
            {"brokers": [{"name": f"b{i}", "readQueueNums": 64, "writeQueueNums": 64} for i in range(64)]},
            "served",
        ),
        Case(
            "Topic",
            "no readable queue",
            {"brokers": [{"name": "b", "readQueueNums": 0, "writeQueueNums": 8}]},
            "served",
        ),
        Case(
            "Topic",
            "perm 7 (read-write-inherit)",
            {"brokers": [{"name": "b", "readQueueNums": 2, "writeQueueNums": 2, "perm": 7}]},
            "served",
        ),
        Case(
            "Topic",
            "write-only broker",
            {"brokers": [{"name": "b", "readQueueNums": 2, "writeQueueNums": 2, "perm": 2}]},
            "served",
        ),
        Case(
            "Topic",
            "unicode zone",
            {"brokers": [{"name": "b", "zone": "zöne-🦀", "readQueueNums": 2, "writeQueueNums": 2}]},
            "served",
        ),
        Case(
            "Topic",
            "same RocketMQ name as orders",
            {**base_topic(), "topicName": "orders"},
            "invalid:InvalidTopic",
            note="the probe group subscribes both this Topic and 'orders'",
        ),
    ]


def corpus(legacy: bool = False) -> list[Case]:
    """Every case, with the fates of the current server or (``legacy``) of 1.20."""
    return [case.on(legacy) for case in generated() + hand_written()]


def _short(value: Any) -> str:
    text = "<missing>" if value is ... else repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} chars)"
