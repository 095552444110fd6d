"""The rebalance journal: one JSON line per published generation.

The operator logs a record each time it publishes; ``mqbalance replay`` reads the
records back and replays every state through every strategy. A record holds the
whole input of the allocation (members and zones, every readable queue and its
zone, the strategy) and its output, so any strategy can be recomputed from it.

    {"kind": "mqbalance.rebalance", "namespace": "shop", "group": "orders-consumer",
     "generation": 7, "time": 1795400000.123, "reason": "member-joined",
     "strategy": {"name": "STICKY", "zoneAffinity": true}, "messageModel": "CLUSTERING",
     "members": {"pod-a": "zone-a"}, "brokerZones": {"broker-a": "zone-a"},
     "queues": {"orders": {"broker-a": [0, 1, 2, 3]}},
     "assignment": {"orders": {"pod-a": {"broker-a": [0, 1, 2, 3]}}},
     "moved": 2, "computeSeconds": 0.0004, "sinceChangeSeconds": 0.012}

``sinceChangeSeconds`` (absent where not measured): from the first change the generation answers, as the
operator saw it (a pod Ready, Terminating or gone, a release), to its publication: the operator's step of a
move's trace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mqbalance.contract import (
    DocumentError,
    Release,
    decode_queue_map,
    encode_queue_map,
    load_json,
    read_strategy,
    reading,
    write_strategy,
)
from mqbalance.model import Assignment, MessageModel, MessageQueue, StrategySpec, sort_queues

KIND = "mqbalance.rebalance"
"""Value of the ``kind`` field that marks a journal line among other log lines."""


@dataclass(frozen=True)
class JournalRecord:
    namespace: str
    group: str
    generation: int
    time: float
    reason: str
    strategy: StrategySpec
    message_model: str
    members: Mapping[str, str]
    """Member -> zone."""
    broker_zones: Mapping[str, str]
    queues: Mapping[str, Sequence[MessageQueue]]
    """Topic -> every readable queue, assigned or not."""
    assignment: Mapping[str, Assignment]
    """Topic -> member -> queues."""
    moved: int
    compute_seconds: float
    releasing: tuple[Release, ...] = ()
    """Queues revoked and held by nobody until their old owner releases them (a handover)."""
    since_change_seconds: float | None = None
    """From the first change this generation answers to its publication (None: not measured)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": KIND,
            "namespace": self.namespace,
            "group": self.group,
            "generation": self.generation,
            "time": self.time,
            "reason": self.reason,
            "strategy": write_strategy(self.strategy),
            "messageModel": self.message_model,
            "members": dict(sorted(self.members.items())),
            "brokerZones": dict(sorted(self.broker_zones.items())),
            "queues": {t: _queue_ids(q) for t, q in sorted(self.queues.items())},
            "assignment": {t: encode_queue_map(a) for t, a in sorted(self.assignment.items())},
            "moved": self.moved,
            "computeSeconds": self.compute_seconds,
        }
        if self.releasing:
            out["releasing"] = [r.to_json() for r in self.releasing]
        if self.since_change_seconds is not None:
            out["sinceChangeSeconds"] = self.since_change_seconds
        return out

    def encode(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any) -> JournalRecord:
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise DocumentError(f'not a journal record (expected "kind": "{KIND}")')
        with reading("journal record", AttributeError):
            queues: dict[str, list[MessageQueue]] = {}
            for topic, by_broker in data["queues"].items():
                queues[topic] = sort_queues(
                    MessageQueue(topic, broker, i) for broker, ids in by_broker.items() for i in ids
                )
            return cls(
                namespace=str(data["namespace"]),
                group=str(data["group"]),
                generation=int(data["generation"]),
                time=float(data["time"]),
                reason=str(data.get("reason", "")),
                strategy=read_strategy(
                    data["strategy"], MessageModel(data.get("messageModel", "CLUSTERING")), "strategy"
                ),
                message_model=str(data.get("messageModel", "CLUSTERING")),
                members={str(k): str(v) for k, v in data["members"].items()},
                broker_zones={str(k): str(v) for k, v in data.get("brokerZones", {}).items()},
                queues=queues,
                assignment={t: decode_queue_map(t, a) for t, a in data["assignment"].items()},
                moved=int(data.get("moved", 0)),
                compute_seconds=float(data.get("computeSeconds", 0.0)),
                releasing=tuple(Release.from_json(r) for r in data.get("releasing") or []),
                since_change_seconds=(
                    None if data.get("sinceChangeSeconds") is None else float(data["sinceChangeSeconds"])
                ),
            )

    @classmethod
    def decode(cls, line: str) -> JournalRecord:
        return cls.from_json(load_json(line, "journal line"))


def _queue_ids(queues: Sequence[MessageQueue]) -> dict[str, list[int]]:
    by_broker: dict[str, list[int]] = {}
    for mq in sort_queues(queues):
        by_broker.setdefault(mq.broker_name, []).append(mq.queue_id)
    return by_broker
