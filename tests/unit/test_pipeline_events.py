"""Journal lines and synthetic churn become replay events."""

from __future__ import annotations

import json

import pytest

from mqbalance.journal import JournalRecord
from mqbalance.model import MessageQueue, StrategyName, StrategySpec
from mqbalance.pipeline import sample_journal, synthetic
from mqbalance.pipeline.events import Event, parse_line, sort_events, strategy_spec


def record(**changes: object) -> JournalRecord:
    fields: dict[str, object] = {
        "namespace": "shop",
        "group": "orders",
        "generation": 3,
        "time": 1795400000.5,
        "reason": "member-joined",
        "strategy": StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=7),
        "message_model": "CLUSTERING",
        "members": {"pod-a": "zone-a", "pod-b": "zone-b"},
        "broker_zones": {"broker-a": "zone-a"},
        "queues": {"orders": [MessageQueue("orders", "broker-a", i) for i in range(3)]},
        "assignment": {"orders": {"pod-a": (MessageQueue("orders", "broker-a", 0),), "pod-b": ()}},
        "moved": 1,
        "compute_seconds": 0.001,
    }
    fields.update(changes)
    return JournalRecord(**fields)  # type: ignore[arg-type]


def test_a_record_becomes_an_event_with_the_allocation_input() -> None:
    parsed = parse_line(record().encode())
    assert parsed.error is None
    assert parsed.event == Event(
        namespace="shop",
        group="orders",
        seq=3,
        time=1795400000.5,
        reason="member-joined",
        members={"pod-a": "zone-a", "pod-b": "zone-b"},
        broker_zones={"broker-a": "zone-a"},
        queues={"orders": {"broker-a": [0, 1, 2]}},
        message_model="CLUSTERING",
        strategy={"name": "CONSISTENT_HASH", "virtualNodes": 7},
    )
    assert strategy_spec(parsed.event.strategy) == StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=7)


def test_a_record_after_a_log_prefix_is_read() -> None:
    parsed = parse_line("2026-01-01 00:00:00 INFO mqbalance.journal " + record().encode() + "\n")
    assert parsed.event is not None
    assert parsed.event.group == "orders"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "[2026-01-01] kopf.objects [INFO] Handler 'reconcile' succeeded.",
        '{"kind": "something.else", "note": "mqbalance.rebalance"}',
        "mqbalance.rebalance published without JSON",
    ],
)
def test_other_log_lines_are_skipped(line: str) -> None:
    parsed = parse_line(line)
    assert parsed.skipped


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (sample_journal.BROKEN_RECORD, "not JSON"),
        (json.dumps({"kind": "mqbalance.rebalance", "namespace": "shop"}), "lacks field"),
    ],
)
def test_broken_records_are_reported_not_skipped(line: str, message: str) -> None:
    parsed = parse_line(line)
    assert not parsed.skipped
    assert parsed.event is None
    assert parsed.error is not None
    assert message in parsed.error


def test_rows_round_trip() -> None:
    for event in synthetic.events(synthetic.Churn(groups=2, events_per_group=5, topics=2)):
        assert Event.from_row(*event.row()) == event


def test_events_sort_by_group_then_time_then_sequence() -> None:
    a2 = Event("ns", "a", seq=2, time=5.0)
    a1 = Event("ns", "a", seq=1, time=5.0)
    a0 = Event("ns", "a", seq=9, time=1.0)
    b0 = Event("ns", "b", seq=0, time=0.0)
    assert sort_events([b0, a2, a1, a0]) == [a0, a1, a2, b0]
