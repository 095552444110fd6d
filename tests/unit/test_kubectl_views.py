"""kubectl mqbalance's views: a group's status, history and what-if from its objects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mqbalance.contract import AssignmentDocument, Release
from mqbalance.kubectl.main import render, strategy_argument
from mqbalance.kubectl.views import (
    ViewError,
    group_status,
    history_text,
    status_text,
    table,
    what_if,
    what_if_text,
)
from mqbalance.model import MessageModel, MessageQueue, StrategyName, StrategySpec
from mqbalance.strategies import allocate_group

TOPIC = "orders"
QUEUES = [MessageQueue(TOPIC, broker, i) for broker in ("broker-a", "broker-b") for i in range(4)]
ZONES = {"c-0": "zone-a", "c-1": "zone-b", "c-2": "zone-a"}


def document(members: dict[str, str] = ZONES, strategy: str = "AVG", **extra: Any) -> AssignmentDocument:
    topics = allocate_group(StrategySpec(StrategyName(strategy)), {TOPIC: QUEUES}, members)
    return AssignmentDocument(
        group="orders-consumers",
        generation=4,
        strategy=strategy,
        message_model=MessageModel.CLUSTERING,
        computed_at=1_800_000_000.0,
        reason="member-joined",
        members=members,
        topics=topics,
        broker_zones={"broker-a": "zone-a", "broker-b": "zone-b"},
        **extra,
    )


def group(status: dict[str, Any] | None = None, strategy: str = "AVG") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "shop", "name": "orders"},
        "spec": {"consumerGroup": "orders-consumers", "topics": [TOPIC], "strategy": {"name": strategy}},
        "status": status or {},
    }


def test_status_lists_every_member_with_its_zone_queues_and_lag() -> None:
    status = {
        "assignmentGeneration": 4,
        "queues": 8,
        "crossZoneQueues": 4,
        "lag": {"total": 120, "mostBehind": [{"member": "c-1", "lag": 100, "queues": 3}]},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Published", "message": "generation 4"}],
    }
    view = group_status(group(status), document())
    assert [(m["name"], m["zone"], m["queues"], m["lag"]) for m in view["members"]] == [
        ("c-0", "zone-a", 3, None),
        ("c-1", "zone-b", 3, 100),
        ("c-2", "zone-a", 2, None),
    ]
    text = status_text(view)
    assert "ConsumerGroup shop/orders (RocketMQ group orders-consumers)" in text
    assert "Lag:         120 messages" in text
    member_lines = [line.split() for line in text.splitlines() if line.startswith("  c-")]
    assert member_lines == [
        ["c-0", "zone-a", "3", "0", "<none>"],
        ["c-1", "zone-b", "3", "0", "100"],
        ["c-2", "zone-a", "2", "0", "<none>"],
    ]
    assert "  Ready   True     Published   generation 4" in text


def test_status_shows_a_handover_in_progress() -> None:
    revoked = Release("c-0", generation=4, since=1_800_000_000.0, queues=(QUEUES[0],))
    doc = document(releasing=(revoked,))
    status = {"handover": {"mode": "Release", "releasingQueues": 1, "waitingFor": ["c-0"]}}
    view = group_status(group(status), doc)
    assert next(m for m in view["members"] if m["name"] == "c-0")["releasing"] == 1
    assert "Handover:    Release: 1 queues being released, waiting for c-0" in status_text(view)


def test_status_of_a_paused_group_says_by_what_and_what_is_still_held() -> None:
    paused = group({"pausedBy": ["spec.paused"], "heldQueues": 2})
    paused["spec"]["paused"] = True
    text = status_text(group_status(paused, document()))
    assert "Paused:      by spec.paused; 2 queues still held" in text
    assert "Paused:" not in status_text(group_status(group(), document()))


def test_status_of_a_group_without_a_document_has_no_members() -> None:
    view = group_status(group(), None)
    assert view["members"] == []
    assert "Members:\n  none" in status_text(view)


def test_what_if_another_strategy_counts_the_moves_from_the_published_assignment() -> None:
    doc = document(strategy="AVG")
    same = what_if(group(), doc)
    assert same.figures["moved"] == 0  # the group's own strategy changes nothing
    circle = what_if(group(), doc, {"name": "AVG_BY_CIRCLE"})
    expected = allocate_group(StrategySpec(StrategyName.AVG_BY_CIRCLE), {TOPIC: QUEUES}, ZONES)[TOPIC]
    assert dict(circle.assignment) == {m: len(q) for m, q in expected.items()}
    before = {q: m for m, qs in doc.topics[TOPIC].items() for q in qs}
    after = {q: m for m, qs in expected.items() for q in qs}
    assert circle.figures["moved"] == sum(before[q] != after[q] for q in QUEUES) > 0
    text = what_if_text(group(), doc, circle)
    assert f"queues moved:      {circle.figures['moved']}" in text


def test_what_if_more_or_fewer_members() -> None:
    doc = document(strategy="STICKY")
    fewer = what_if(group(strategy="STICKY"), doc, members=2)
    assert set(fewer.members) == {"c-0", "c-1"}
    assert fewer.figures["moved"] == fewer.figures["minimumMoves"] == 2  # c-2's two queues, nothing else
    more = what_if(group(strategy="STICKY"), doc, members=5)
    assert more.members == {**ZONES, "new-1": "zone-a", "new-2": "zone-b"}
    assert sorted(more.assignment.values()) == [1, 1, 2, 2, 2]
    assert more.figures["moved"] == more.figures["minimumMoves"]


@pytest.mark.parametrize(
    ("strategy", "members", "message"),
    [
        ({"name": "NOPE"}, None, "--strategy"),
        ({"name": "CONSISTENT_HASH", "virtualNodes": 0}, None, "virtualNodes"),
        (None, 0, "--members must be at least 1"),
    ],
)
def test_what_if_refuses_what_cannot_be_computed(
    strategy: dict[str, Any] | None, members: int | None, message: str
) -> None:
    with pytest.raises(ViewError, match=message):
        what_if(group(), document(), strategy, members)


def test_history_table_and_json() -> None:
    entries = [
        {"generation": 5, "time": "2026-11-28T20:00:00Z", "reason": "member-left", "members": 2, "moved": 3},
        {
            "generation": 4,
            "time": "2026-11-28T19:00:00Z",
            "reason": "member-joined",
            "members": 3,
            "moved": 2,
        },
    ]
    lines = history_text(entries).splitlines()
    assert lines[0].split() == ["GENERATION", "TIME", "REASON", "MEMBERS", "MOVED"]
    assert lines[1].split() == ["5", "2026-11-28T20:00:00Z", "member-left", "2", "3"]
    assert history_text([]) == "No generations recorded yet."
    assert json.loads(render("history", "json", (entries, ""))) == entries
    assert "reason: member-left" in render("history", "yaml", (entries, ""))


def test_table_pads_as_kubectl_does() -> None:
    assert table(["name", "queues"], [["a", 1], ["long-name", None]]).splitlines() == [
        "NAME        QUEUES",
        "a           1",
        "long-name   <none>",
    ]


def test_strategy_argument_takes_a_name_or_json() -> None:
    assert strategy_argument("avg") == {"name": "AVG"}
    assert strategy_argument('{"name": "STICKY", "zoneAffinity": true}') == {
        "name": "STICKY",
        "zoneAffinity": True,
    }
    with pytest.raises(ViewError, match="not JSON"):
        strategy_argument("{nope")
