"""kopf's ToggleSet after mqbalance.operator.kopf_startup: same waits, wake-ups only on a change of state."""

from __future__ import annotations

import asyncio

import pytest
from kopf._cogs.aiokits import aiotoggles

from mqbalance.operator.kopf_startup import patch_toggle_sets

pytestmark = pytest.mark.asyncio


def _count_notifies(toggles: aiotoggles.ToggleSet) -> list[int]:
    calls = [0]
    condition = toggles._condition
    original = condition.notify_all

    def counting() -> None:
        calls[0] += 1
        original()

    condition.notify_all = counting  # type: ignore[method-assign]
    return calls


async def test_waiters_wake_once_when_the_last_toggle_goes() -> None:
    assert patch_toggle_sets()
    toggles = aiotoggles.ToggleSet(all)
    blockers = [await toggles.make_toggle(name=f"object-{i}") for i in range(50)]
    notifies = _count_notifies(toggles)
    waiters = [asyncio.create_task(toggles.wait_for(True)) for _ in range(20)]
    await asyncio.sleep(0)
    for toggle in blockers[:-1]:
        await toggles.drop_toggle(toggle)
        await toggles.make_toggle(True)  # an "on" toggle added while others are off changes nothing
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    assert notifies[0] == 0
    await toggles.drop_toggle(blockers[-1])
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    assert notifies[0] == 1


async def test_adding_an_off_toggle_to_an_on_set_wakes_waiters_for_off() -> None:
    assert patch_toggle_sets()
    toggles = aiotoggles.ToggleSet(all)
    assert toggles.is_on()
    waiter = asyncio.create_task(toggles.wait_for(False))
    await asyncio.sleep(0)
    await toggles.make_toggle(False)
    await asyncio.wait_for(waiter, 1)
    assert toggles.is_off()


async def test_turning_a_member_toggle_still_wakes_waiters() -> None:
    assert patch_toggle_sets()
    toggles = aiotoggles.ToggleSet(all)
    toggle = await toggles.make_toggle(False)
    waiter = asyncio.create_task(toggles.wait_for(True))
    await asyncio.sleep(0)
    await toggle.turn_to(True)
    await asyncio.wait_for(waiter, 1)


async def test_drop_toggles_at_once() -> None:
    assert patch_toggle_sets()
    toggles = aiotoggles.ToggleSet(all)
    made = [await toggles.make_toggle() for _ in range(3)]
    waiter = asyncio.create_task(toggles.wait_for(True))
    await asyncio.sleep(0)
    await toggles.drop_toggles(made)
    await asyncio.wait_for(waiter, 1)
    assert len(toggles) == 0
