"""The demo's tables: members with their zones and loads, and which queues moved from whom to whom."""

from __future__ import annotations

from dataclasses import replace

from harness.demo import report as demo_report
from mqbalance.contract import AssignmentDocument
from mqbalance.model import MessageModel, MessageQueue


def q(broker: str, queue_id: int, topic: str = "orders") -> MessageQueue:
    return MessageQueue(topic, broker, queue_id)


def doc(generation: int, members: dict[str, str], held: dict[str, list[MessageQueue]]) -> AssignmentDocument:
    return AssignmentDocument(
        group="g",
        generation=generation,
        strategy="STICKY",
        message_model=MessageModel.CLUSTERING,
        computed_at=0.0,
        reason="member-joined",
        members=members,
        topics={"orders": {m: tuple(held.get(m, [])) for m in members}},
        broker_zones={"broker-a": "zone-a", "broker-b": "zone-b"},
    )


BEFORE = doc(
    1,
    {"p0": "zone-a", "p1": "zone-b"},
    {"p0": [q("broker-a", 0), q("broker-a", 1)], "p1": [q("broker-b", 0)]},
)
AFTER = doc(
    2,
    {"p0": "zone-a", "p2": "zone-a"},
    {"p0": [q("broker-a", 0), q("broker-b", 0)], "p2": [q("broker-a", 1), q("broker-b", 1)]},
)


def test_moves_name_the_queue_its_previous_and_its_new_holder() -> None:
    assert demo_report.moves(BEFORE, AFTER) == [
        demo_report.Move(q("broker-a", 1), "p0", "p2"),
        demo_report.Move(q("broker-b", 0), "p1", "p0"),
        demo_report.Move(q("broker-b", 1), None, "p2"),
    ]
    assert demo_report.moves(AFTER, AFTER) == []


def test_moves_table_marks_new_queues() -> None:
    text = demo_report.moves_table(demo_report.moves(BEFORE, AFTER))
    lines = text.splitlines()
    assert lines[0].split() == ["QUEUE", "FROM", "TO"]
    assert lines[1].split() == ["orders/broker-a:1", "p0", "p2"]
    assert lines[3].split() == ["orders/broker-b:1", "(new)", "p2"]
    assert demo_report.moves_table([]) == "  no queue changed owner"


def test_assignment_table_counts_load_and_cross_zone_queues() -> None:
    text = demo_report.assignment_table(AFTER, {"p2": "new"})
    lines = text.splitlines()
    assert lines[0] == "generation 2 (STICKY, reason: member-joined)"
    assert lines[2].split() == ["p0", "zone-a", "2", "1", "broker-a:0", "broker-b:0"]
    assert lines[3].split() == ["p2", "zone-a", "2", "1", "broker-a:1", "broker-b:1", "new"]


def test_compact_queues_groups_by_broker_and_names_topics_when_several() -> None:
    assert (
        demo_report.compact_queues([q("broker-b", 2), q("broker-a", 1), q("broker-a", 0)])
        == "broker-a:0,1 broker-b:2"
    )
    assert demo_report.compact_queues([q("b", 0, "t1"), q("b", 0, "t2")]) == "t1/b:0 t2/b:0"
    assert demo_report.compact_queues([]) == "-"


def test_summary_compares_moves_with_the_minimum() -> None:
    # p1 left, so broker-b:0 had to move (forced); broker-a:1 moved although p0 stayed.
    line = demo_report.summary(BEFORE, AFTER)
    assert "2 queue(s) moved (1 forced by departed members)" in line
    assert "Loads 2..2, 2 queue(s) held across zones." in line
    assert "allows is 1." in line  # every member in zone-a: the minimum needs no qualifier


def test_summary_says_the_minimum_leaves_zones_aside_when_members_span_zones() -> None:
    spread = replace(AFTER, members={**AFTER.members, "p2": "zone-b"})
    assert "allows is 1 (zones aside)." in demo_report.summary(BEFORE, spread)
