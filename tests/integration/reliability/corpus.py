"""A corpus of malformed and hostile Topic and ConsumerGroup objects, each with its expected fate.

Most cases come from a compact table: a field path in a valid base object and the bad values to
put there. Hand-written cases follow for what a path and a value cannot say (several fields at
once, references between objects, deep junk). Fates:

- ``rejected``: the API server answers 422 at admission, naming ``where``;
- ``invalid:<Reason>``: accepted; the group (for a Topic: a probe group subscribing it) reports
  condition Invalid=True with that reason and a message;
- ``not-ready:<Reason>``: accepted and valid; the group reports Ready=False with that reason;
- ``served``: accepted and served (Ready=True), e.g. unknown fields the schema prunes.

The 1.20 API server turns an empty string in a custom object into null before validation, so ""
in any string field is rejected (``must be string``) even where the schema would allow it: a
Topic broker's ``zone: ""`` cannot mean "unknown"; leave the field out instead.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

PROBE_LABELS = {"probe": "yes"}
DEEP = 60


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
        ...,
        [{"name": f"b{i}", "readQueueNums": 1, "writeQueueNums": 1} for i in range(65)],
    ],
    "brokers[0].readQueueNums": [-1, 1025, 2**40, "8", 1.5, True, None, ...],
    "brokers[0].writeQueueNums": [-1, 1025, "x", 3.25, None, ...],
    "brokers[0].perm": [16, -1, "6", 6.5],
    "brokers[0].name": ["", "has space", "x" * 128, "ünïcode", "a/b", None, 42, ...],
    "brokers[0].zone": ["", "z" * 64, 7, ["zone-a"]],
    "topicName": ["", "has space", "t" * 128, "topic/with/slash", "日本", 1],
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
    "zoneLabel": ["", "l" * 317, 5],
    "debounceSeconds": [-1, 601, "2", True, 1e308, -0.001],
    "groupName": ["has space", "g" * 256, "ünïcode", "a/b"],
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
            "ConsumerGroup",
            "MACHINE_ROOM without idcs",
            {**base_group(), "strategy": {"name": "MACHINE_ROOM"}},
            "invalid:InvalidSpec",
        ),
        Case(
            "ConsumerGroup",
            "CONFIG without map",
            {**base_group(), "strategy": {"name": "CONFIG"}},
            "invalid:InvalidSpec",
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
            "invalid:InvalidSpec",
        ),
        Case(
            "ConsumerGroup",
            "Exists with values",
            {
                "topics": ["orders"],
                "selector": {"matchExpressions": [{"key": "probe", "operator": "Exists", "values": ["yes"]}]},
            },
            "invalid:InvalidSpec",
        ),
        Case(
            "ConsumerGroup",
            "name longer than a label value",
            base_group(),
            "invalid:InvalidSpec",
            resource_name="g" * 64,
            note="the group name is the ConfigMap's mqbalance.io/group label value (at most 63 characters)",
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
        Case(
            "Topic",
            "huge: 64 brokers of 1024 queues",
            {
                "brokers": [
                    {"name": f"b{i}", "readQueueNums": 1024, "writeQueueNums": 1024} for i in range(64)
                ]
            },
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


def corpus() -> list[Case]:
    return generated() + hand_written()


def _short(value: Any) -> str:
    text = "<missing>" if value is ... else repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} chars)"
