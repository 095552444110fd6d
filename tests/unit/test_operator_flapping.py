"""Flapping: a member that joins and leaves more than 3 times in 10 minutes turns the group's Flapping
condition True, names it in status.flappingMembers and the gauge counts it; the condition turns
False by itself once those changes are 10 minutes old (driven through the whole controller with a
hand timer: the operator's clock is 1_800_000_000 + the timer)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mqbalance.operator.status import FLAPPING_CHANGES, FLAPPING_WINDOW, flapping, history_entry
from tests.unit.test_operator_loop import NS, Harness, group, pod, start

EPOCH = 1_800_000_000.0


def status(h: Harness) -> dict[str, Any]:
    return dict(h.world.groups[(NS, "g")].publication.status or {})


def flapping_condition(h: Harness) -> dict[str, Any] | None:
    return next((c for c in status(h).get("conditions") or [] if c["type"] == "Flapping"), None)


@pytest.mark.asyncio
async def test_a_member_that_comes_and_goes_is_flapping_until_its_changes_are_ten_minutes_old() -> None:
    async with Harness() as h:
        await start(h, group(debounce=0.0), [pod("p1"), pod("p2")])
        assert flapping_condition(h) is None  # a group that never flapped has none
        for i in range(FLAPPING_CHANGES + 1):  # p2 leaves and joins again and again, 20 s apart
            ready = i % 2 == 1
            h.world.on_pod((NS, "p2"), None, replace(pod("p2"), ready=ready))
            await h.settle()
            h.timer.advance(20)
        history = status(h)["history"]
        assert [(e["reason"], e.get("joined"), e.get("left")) for e in history[:2]] == [
            ("member-joined", ["p2"], None),
            ("member-left", None, ["p2"]),
        ]
        condition = flapping_condition(h)
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("True", "MembersFlapping")
        assert condition["message"] == "joined or left more than 3 times in 10 minutes: p2 (4 times)"
        assert status(h)["flappingMembers"] == ["p2"]
        assert h.counter("mqbalance_group_flapping_members", namespace=NS, group="g") == 1
        # Nothing changes any more: the reconcile the operator scheduled clears it on time.
        h.timer.advance(FLAPPING_WINDOW - 4 * 20 - 1)
        await h.settle()
        assert flapping_condition(h)["status"] == "True"  # type: ignore[index]
        h.timer.advance(21)
        await h.settle()
        condition = flapping_condition(h)
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("False", "Stable")
        assert "flappingMembers" not in status(h)
        assert h.counter("mqbalance_group_flapping_members", namespace=NS, group="g") == 0


def test_only_changes_within_the_window_count_and_only_above_the_bound() -> None:
    def entry(at: float, joined: list[str] = [], left: list[str] = []) -> dict[str, Any]:  # noqa: B006
        return history_entry(1, at, "members-changed", 2, 0, None, joined, left)

    now = EPOCH + 1000
    three = [entry(now - 10, ["a"]), entry(now - 20, left=["a"]), entry(now - 30, ["a", "b"])]
    assert flapping(three, now).members == {}
    four = [*three, entry(now - 40, left=["a"])]
    found = flapping(four, now)
    assert found.members == {"a": 4}
    assert found.wake_at == now - 40 + FLAPPING_WINDOW
    stale = [*three, entry(now - FLAPPING_WINDOW, left=["a"])]
    assert flapping(stale, now).members == {}
    assert flapping([{"time": "not a time", "joined": ["a"] * 9}], now).members == {}
