"""Replay events: one membership/topology state of one consumer group.

Journal records and synthetic churn both become :class:`Event`. An event keeps
only what an allocation needs (members and zones, readable queues, broker zones,
message model) plus the strategy the group ran, so Spark can ship it as one
compact JSON string per row; the replay reads it back with :meth:`Event.decode`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import DocumentError, read_strategy, write_strategy
from mqbalance.journal import KIND, JournalRecord
from mqbalance.model import MessageModel, MessageQueue, StrategyName, StrategySpec

QueueIds = Mapping[str, Mapping[str, list[int]]]
"""topic -> broker -> readable queue ids."""

Rates = Mapping[str, Mapping[str, list[float]]]
"""topic -> broker -> messages/s of each queue, in the order of its ids in ``queues``."""

DEFAULT_STRATEGY: dict[str, Any] = {"name": StrategyName.AVG.value}
"""RocketMQ's default strategy: the "current" one of synthetic groups."""


@dataclass(frozen=True)
class Event:
    """One state of a group, in the order ``(time, seq)`` within the group."""

    namespace: str
    group: str
    seq: int
    time: float
    reason: str = ""
    members: Mapping[str, str] = field(default_factory=dict)
    """Member -> zone."""
    broker_zones: Mapping[str, str] = field(default_factory=dict)
    queues: QueueIds = field(default_factory=dict)
    message_model: str = "CLUSTERING"
    strategy: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_STRATEGY))
    """The strategy the group ran, in the journal's JSON form."""
    rates: Rates = field(default_factory=dict)
    """Measured messages/s per queue, where known (synthetic churn with ``rate_skew``)."""

    @property
    def topics(self) -> list[str]:
        return sorted(self.queues)

    def queues_of(self, topic: str) -> list[MessageQueue]:
        return [MessageQueue(topic, broker, i) for broker, ids in self.queues[topic].items() for i in ids]

    def loads(self) -> dict[MessageQueue, float]:
        """Each queue's rate, for the queues that have one."""
        return {
            MessageQueue(topic, broker, queue_id): rate
            for topic, by_broker in self.rates.items()
            for broker, values in by_broker.items()
            for queue_id, rate in zip(self.queues.get(topic, {}).get(broker, []), values, strict=False)
        }

    def payload(self) -> str:
        """The event's state as compact JSON (the ``event`` column of the Spark rows)."""
        data: dict[str, Any] = {
            "reason": self.reason,
            "members": self.members,
            "brokerZones": self.broker_zones,
            "queues": self.queues,
            "messageModel": self.message_model,
            "strategy": self.strategy,
        }
        if self.rates:
            data["rates"] = self.rates
        return json.dumps(
            data,
            separators=(",", ":"),
            sort_keys=True,
        )

    def row(self) -> tuple[str, str, int, float, str]:
        """(namespace, group, seq, time, payload): the columns of an events DataFrame."""
        return (self.namespace, self.group, self.seq, self.time, self.payload())

    @classmethod
    def from_row(cls, namespace: str, group: str, seq: int, time: float, payload: str) -> Event:
        data = json.loads(payload)
        return cls(
            namespace=namespace,
            group=group,
            seq=int(seq),
            time=float(time),
            reason=data.get("reason", ""),
            members=data["members"],
            broker_zones=data.get("brokerZones", {}),
            queues=data["queues"],
            message_model=data.get("messageModel", "CLUSTERING"),
            strategy=data.get("strategy", DEFAULT_STRATEGY),
            rates=data.get("rates", {}),
        )


EVENT_COLUMNS = ("namespace", "group", "seq", "time", "event")
EVENT_SCHEMA = "namespace string, group string, seq long, time double, event string"


def event_from_record(record: JournalRecord) -> Event:
    queues: dict[str, dict[str, list[int]]] = {}
    for topic, mqs in sorted(record.queues.items()):
        by_broker: dict[str, list[int]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq.queue_id)
        queues[topic] = by_broker
    return Event(
        namespace=record.namespace,
        group=record.group,
        seq=record.generation,
        time=record.time,
        reason=record.reason,
        members=dict(record.members),
        broker_zones=dict(record.broker_zones),
        queues=queues,
        message_model=record.message_model,
        strategy=write_strategy(record.strategy),
    )


@dataclass(frozen=True)
class ParsedLine:
    """What one journal file line holds: an event, another log line, or a broken record."""

    event: Event | None = None
    error: str | None = None
    """Set for a line marked as a journal record that cannot be read."""

    @property
    def skipped(self) -> bool:
        return self.event is None and self.error is None


def parse_line(line: str) -> ParsedLine:
    """Read one line of a journal file.

    Journal files are often whole operator logs: lines that do not carry the
    journal ``kind`` are other log output and are skipped. A record may sit after
    a log prefix (``2025-... INFO {...}``), so parsing starts at the first ``{``.
    """
    if KIND not in line:
        return ParsedLine()
    line = line.rstrip("\r\n")
    start = line.find("{")
    if start < 0:
        return ParsedLine()
    try:
        data = json.loads(line[start:])
    except json.JSONDecodeError as e:
        return ParsedLine(error=f"journal line is not JSON: {e}")
    if not isinstance(data, dict) or data.get("kind") != KIND:
        return ParsedLine()
    try:
        return ParsedLine(event=event_from_record(JournalRecord.from_json(data)))
    except DocumentError as e:
        return ParsedLine(error=str(e))


def sort_events(events: Iterable[Event]) -> list[Event]:
    """Events grouped by (namespace, group), each group in time order."""
    return sorted(events, key=lambda e: (e.namespace, e.group, e.time, e.seq))


def strategy_spec(strategy: Mapping[str, Any], message_model: str = "CLUSTERING") -> StrategySpec:
    """The journal's strategy JSON as a spec."""
    return read_strategy(dict(strategy), MessageModel(message_model), where="strategy")
