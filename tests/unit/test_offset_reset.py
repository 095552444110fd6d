"""The pure decisions of an OffsetReset: its spec, targets, preview totals, compare-and-set and the
pause it holds (the world's ``pause_holds`` and the routing of its changes)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbalance.contract.bounds import MAX_RESET_QUEUES
from mqbalance.operator.offset_reset import (
    PAUSING,
    PROPOSED,
    SUCCEEDED,
    QueueReading,
    ResetRefused,
    ResetTarget,
    changed,
    check_size,
    drifted,
    holds_group,
    preview_rows,
    read_reset_spec,
    reset_topics,
    resolve_targets,
    totals,
)
from mqbalance.operator.spec import parse_group
from mqbalance.operator.world import World

GROUP = parse_group("orders", {"topics": ["orders", "audit"], "selector": {"matchLabels": {"app": "o"}}})
Q0, Q1 = ("orders", "broker-a", 0), ("orders", "broker-a", 1)
READINGS = {Q0: QueueReading(10, 100, 50), Q1: QueueReading(0, 40, None)}


class refused:
    """Refused with ``reason``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, _: Any) -> bool:
        assert isinstance(error, ResetRefused), f"not refused: {error!r}"
        assert error.reason == self.reason, error.message
        return True


def spec(**to: Any) -> dict[str, Any]:
    return {"group": "orders", "to": to}


def test_each_kind_of_target_is_read() -> None:
    assert read_reset_spec(spec(time="2026-11-29T08:00:00Z")).target.time_ms == 1_795_939_200_000
    assert read_reset_spec(spec(time="2026-11-29T09:00:00+01:00")).target.time_ms == 1_795_939_200_000
    assert read_reset_spec(spec(position="Latest")).target.position == "Latest"
    assert read_reset_spec(spec(fromGroup="billing")).target.from_group == "billing"
    offsets = [{"topic": "orders", "brokerName": "broker-a", "queueId": 1, "offset": 7}]
    assert read_reset_spec(spec(offsets=offsets)).target.offsets == {Q1: 7}
    assert read_reset_spec({**spec(position="Earliest"), "leavePaused": True}).leave_paused


@pytest.mark.parametrize(
    "body",
    [
        None,
        {"to": {"position": "Latest"}},
        spec(),
        spec(position="Latest", fromGroup="x"),
        spec(time="yesterday"),
        spec(time="2026-11-29T08:00:00"),
        spec(position="Middle"),
        spec(offsets=[]),
        spec(offsets=[{"topic": "orders", "brokerName": "broker-a", "queueId": 0}]),
        spec(offsets=[{"topic": "orders", "brokerName": "b", "queueId": 0, "offset": 1}] * 2),
    ],
)
def test_a_spec_the_schema_would_refuse_is_refused_with_what_to_fix(body: Any) -> None:
    with refused("InvalidSpec"):
        read_reset_spec(body)


def test_topics_default_to_the_groups_and_others_are_refused() -> None:
    assert reset_topics(read_reset_spec(spec(position="Latest")), GROUP) == ("orders", "audit")
    assert reset_topics(read_reset_spec({**spec(position="Latest"), "topics": ["audit"]}), GROUP) == (
        "audit",
    )
    with refused("TopicNotSubscribed"):
        reset_topics(read_reset_spec({**spec(position="Latest"), "topics": ["payments"]}), GROUP)
    stray = [{"topic": "audit", "brokerName": "broker-a", "queueId": 0, "offset": 1}]
    with refused("TopicNotSubscribed"):
        reset_topics(read_reset_spec({**spec(offsets=stray), "topics": ["orders"]}), GROUP)
    broadcasting = parse_group("b", {"topics": ["t"], "selector": {}, "messageModel": "BROADCASTING"})
    with refused("Broadcasting"):
        reset_topics(read_reset_spec(spec(position="Latest")), broadcasting)


def test_targets_come_from_the_queue_ends_the_search_or_the_source_group() -> None:
    assert resolve_targets(ResetTarget(position="Earliest"), READINGS) == {Q0: 10, Q1: 0}
    assert resolve_targets(ResetTarget(position="Latest"), READINGS) == {Q0: 100, Q1: 40}
    assert resolve_targets(ResetTarget(time_ms=1), READINGS, {Q0: 60, Q1: 40}) == {Q0: 60, Q1: 40}
    assert resolve_targets(ResetTarget(from_group="b"), READINGS, None, {Q0: 70, Q1: 3}) == {Q0: 70, Q1: 3}
    assert resolve_targets(ResetTarget(offsets={Q1: 5}), READINGS) == {Q1: 5}


def test_a_target_outside_its_queue_or_without_a_source_offset_is_refused_naming_the_queue() -> None:
    with pytest.raises(ResetRefused) as caught:
        resolve_targets(ResetTarget(offsets={Q0: 5, Q1: 41}), READINGS)
    assert caught.value.reason == "TargetOutOfRange"
    assert "orders/broker-a/0 (5 not in [10, 100])" in caught.value.message
    assert "orders/broker-a/1 (41 not in [0, 40])" in caught.value.message
    with pytest.raises(ResetRefused) as caught:
        resolve_targets(ResetTarget(from_group="billing"), READINGS, None, {Q0: 20, Q1: None})
    assert caught.value.reason == "SourceHasNoOffset"
    assert "billing has committed no offset of orders/broker-a/1" in caught.value.message
    with refused("UnknownQueue"):
        resolve_targets(ResetTarget(offsets={("orders", "broker-z", 0): 1}), READINGS)
    with refused("TooManyQueues"):
        check_size(MAX_RESET_QUEUES + 1)
    check_size(MAX_RESET_QUEUES)


def test_the_preview_counts_messages_skipped_and_replayed_over_queues_that_had_committed() -> None:
    rows = preview_rows(READINGS, {Q0: 30, Q1: 40})
    assert rows[0] == {
        "topic": "orders",
        "brokerName": "broker-a",
        "queueId": 0,
        "committed": 50,
        "target": 30,
        "min": 10,
        "max": 100,
    }
    assert "committed" not in rows[1]
    assert totals(rows) == {"queues": 2, "skipped": 0, "replayed": 20}
    assert totals(preview_rows(READINGS, {Q0: 90, Q1: 0})) == {"queues": 2, "skipped": 40, "replayed": 0}


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=30))
def test_skipped_minus_replayed_is_the_sum_of_the_moves(pairs: list[tuple[int, int]]) -> None:
    readings = {("t", "b", i): QueueReading(0, 10**6, c) for i, (c, _) in enumerate(pairs)}
    targets = {("t", "b", i): t for i, (_, t) in enumerate(pairs)}
    assert resolve_targets(ResetTarget(offsets=targets), readings) == targets
    figures = totals(preview_rows(readings, targets))
    assert figures["skipped"] - figures["replayed"] == sum(t - c for c, t in pairs)
    assert min(figures["skipped"], figures["replayed"]) >= 0


def test_the_compare_and_set_tells_consumption_from_drift() -> None:
    rows = preview_rows(READINGS, {Q0: 10, Q1: 0})
    # The group ran after the preview: its consumption moved Q0 forward; nothing drifted.
    assert drifted(rows, {Q0: 80, Q1: None}, paused_at_preview=False) == []
    # Back, or gone, is not consumption.
    assert drifted(rows, {Q0: 20, Q1: None}, paused_at_preview=False) == ["orders/broker-a/0 (50 -> 20)"]
    assert drifted(rows, {Q0: None, Q1: None}, paused_at_preview=False) == ["orders/broker-a/0 (50 -> none)"]
    # Paused when previewed, nothing of the group's may move it: any change is drift.
    assert drifted(rows, {Q0: 51, Q1: 3}, paused_at_preview=True) == [
        "orders/broker-a/0 (50 -> 51)",
        "orders/broker-a/1 (none -> 3)",
    ]
    assert drifted(rows, {Q0: 50, Q1: None}, paused_at_preview=True) == []


def test_readings_that_differ_name_each_queue_that_moved() -> None:
    assert changed({Q0: 5, Q1: None}, {Q0: 5, Q1: None}) == []
    assert changed({Q0: 5, Q1: None}, {Q0: 6, Q1: 2}) == [
        "orders/broker-a/0 (5 -> 6)",
        "orders/broker-a/1 (none -> 2)",
    ]


def test_a_reset_holds_its_group_from_approval_to_its_end_or_after_it_when_asked() -> None:
    assert not holds_group({"phase": PROPOSED}, leave_paused=True)
    assert holds_group({"phase": PAUSING}, leave_paused=False)
    assert not holds_group({"phase": SUCCEEDED}, leave_paused=False)
    assert holds_group({"phase": SUCCEEDED}, leave_paused=True)
    assert not holds_group({"phase": "Failed"}, leave_paused=True)


def _reset(name: str, phase: str | None, group: str = "orders") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": name},
        "spec": {"group": group, "to": {"position": "Latest"}},
        "status": {"phase": phase} if phase else {},
    }


def _group(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "orders", "uid": "g", "generation": 1},
        "spec": {"topics": ["orders"], "selector": {}},
        "status": status or {},
    }


async def _drain(world: World) -> set[tuple[str, str, str]]:
    keys = set()
    while len(world.queue):
        key = await world.queue.get()
        keys.add(key)
        world.queue.done(key)
    return keys


@pytest.mark.asyncio
async def test_the_world_pauses_the_group_while_a_reset_holds_it_and_reconciles_it_when_that_changes() -> (
    None
):
    world = World()
    world.synced.set()
    world.on_group(("ns", "orders"), None, _group())
    world.on_reset(("ns", "r1"), None, _reset("r1", None))
    assert await _drain(world) == {("group", "ns", "orders"), ("reset", "ns", "r1")}
    assert world.pause_holds("ns", "orders") == ()
    world.on_reset(("ns", "r1"), _reset("r1", None), _reset("r1", PROPOSED))
    assert await _drain(world) == {("reset", "ns", "r1")}  # nothing held yet: the group is not reconciled
    world.on_reset(("ns", "r1"), _reset("r1", PROPOSED), _reset("r1", PAUSING))
    assert await _drain(world) == {("group", "ns", "orders"), ("reset", "ns", "r1")}
    assert world.pause_holds("ns", "orders") == ("OffsetReset/r1",)
    # The group's status changing (Paused turning True) wakes the reset that waits for it.
    world.on_group(("ns", "orders"), _group(), _group({"pausedBy": ["OffsetReset/r1"]}))
    assert await _drain(world) == {("reset", "ns", "r1")}
    world.on_reset(("ns", "r1"), _reset("r1", PAUSING), None)  # deleted: the group resumes
    assert await _drain(world) == {("group", "ns", "orders")}
    assert world.pause_holds("ns", "orders") == ()
    assert world.reset_owner("ns", "r2") == "r2"
