"""The keyed work queue: one worker per key, a key queued once, re-run after its run when added
meanwhile, the earliest of several delays, lower priorities first, backoff after failures."""

from __future__ import annotations

import asyncio

import pytest

from mqbalance.operator.workqueue import WorkQueue
from tests.unit.test_operator_loop import HandTimer

pytestmark = pytest.mark.asyncio


async def test_a_key_is_queued_once_and_runs_again_if_added_while_running() -> None:
    queue: WorkQueue[str] = WorkQueue(HandTimer())
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    first = await queue.get()
    queue.add(first)  # changed while being processed: again after, not twice at once
    assert len(queue) == 1
    second = await queue.get()
    assert {first, second} == {"a", "b"}
    queue.done(first)
    assert await queue.get() == first


async def test_the_earliest_delay_wins_and_an_add_cuts_it_short() -> None:
    timer = HandTimer()
    queue: WorkQueue[str] = WorkQueue(timer)
    queue.add_after("k", 5.0)
    queue.add_after("k", 2.0)  # earlier: wins
    queue.add_after("k", 9.0)  # later: ignored
    assert queue.due_at("k") == 2.0
    timer.advance(1.9)
    assert len(queue) == 0
    timer.advance(0.1)
    assert len(queue) == 1
    queue.add_after("j", 30.0)
    queue.add("j")  # urgent: at once, and the timer is dropped
    assert queue.due_at("j") is None
    assert len(queue) == 2


async def test_lower_priorities_go_first() -> None:
    queue: WorkQueue[tuple[str, str]] = WorkQueue(
        HandTimer(), priority=lambda key: 0 if key[0] == "group" else 1
    )
    for key in [("topic", "t1"), ("group", "g1"), ("topic", "t2"), ("group", "g2")]:
        queue.add(key)
    order = [await queue.get() for _ in range(4)]
    assert order == [("group", "g1"), ("group", "g2"), ("topic", "t1"), ("topic", "t2")]


async def test_a_waiting_worker_is_handed_the_key_and_a_cancelled_one_gives_it_back() -> None:
    queue: WorkQueue[str] = WorkQueue(HandTimer())
    waiting = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    queue.add("x")
    assert await waiting == "x"
    queue.done("x")
    # Handed "y" and cancelled before it ran again: the cancellation always wins (the task is
    # resumed with CancelledError, not with the key), and the key goes back to the queue.
    cancelled = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)  # it waits
    queue.add("y")  # its future now holds "y"
    assert cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert cancelled.cancelled()
    assert len(queue) == 1
    assert await queue.get() == "y"  # given back, not lost
    queue.done("y")
    # Cancelled while still waiting: it takes nothing, and the next key waits in the queue.
    idle = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    assert idle.cancel()
    await asyncio.gather(idle, return_exceptions=True)
    assert idle.cancelled()
    queue.add("z")
    assert len(queue) == 1
    assert await queue.get() == "z"


async def test_a_failing_key_backs_off_doubling_to_a_minute_until_it_succeeds() -> None:
    timer = HandTimer()
    queue: WorkQueue[str] = WorkQueue(timer)
    delays = []
    for _ in range(8):
        delays.append(queue.add_rate_limited("k"))
        assert queue.due_at("k") == timer.now() + delays[-1]
        timer.advance(delays[-1])
        assert await queue.get() == "k"
        queue.done("k")
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert queue.failures("k") == 8
    queue.forget_failures("k")  # processed: the next failure starts over
    assert queue.add_rate_limited("k") == 1.0
    queue.forget("k")  # its object is gone: so are its failures
    assert queue.failures("k") == 0
    assert queue.due_at("k") is None
