"""minReadySeconds: a pod is given queues only once it has been Ready that long, longer after restarts,
so a crash-looping pod no longer moves queues at every restart (driven through the whole controller
with a hand timer: the operator's clock is 1_800_000_000 + the timer)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from mqbalance.operator.membership import FLAP_WINDOW, MAX_FLAP_FACTOR, PodInfo, pod_info, ready_wait
from tests.unit.test_operator_loop import NS, Harness, group, pod, start

EPOCH = 1_800_000_000.0


def ready_pod(h: Harness, name: str, restarts: int = 0) -> PodInfo:
    """``name`` turning Ready now; its containers restarted ``restarts`` times, the last just now."""
    now = EPOCH + h.timer.time
    return replace(pod(name), ready_since=now, restarts=restarts, restarted_at=now if restarts else None)


def members(h: Harness) -> list[str]:
    return sorted(h.journal.records[-1].members)


def not_serving(h: Harness) -> list[tuple[str, str]]:
    status = h.world.groups[(NS, "g")].publication.status or {}
    return [(p["name"], p["reason"]) for p in status.get("notServingPods") or []]


@pytest.mark.asyncio
async def test_a_pod_gets_queues_once_ready_for_min_ready_seconds() -> None:
    async with Harness() as h:
        await start(h, group(debounce=0.0, minReadySeconds=30), [pod("p1")])
        assert members(h) == ["p1"]  # no Ready time reported: not held back
        h.world.on_pod((NS, "p2"), None, ready_pod(h, "p2"))
        await h.settle()
        assert members(h) == ["p1"]
        assert not_serving(h) == [("p2", "MinReadySeconds")]
        h.timer.advance(29.9)
        await h.settle()
        assert members(h) == ["p1"]
        h.timer.advance(0.1)  # the reconcile the operator scheduled for when p2 is due
        await h.settle()
        assert members(h) == ["p1", "p2"]
        assert h.journal.records[-1].reason == "member-joined"
        assert not_serving(h) == []


@pytest.mark.asyncio
async def test_a_pod_that_restarted_recently_waits_longer_bounded() -> None:
    async with Harness() as h:
        await start(h, group(debounce=0.0, minReadySeconds=10), [pod("p1")])
        h.world.on_pod((NS, "p2"), None, ready_pod(h, "p2", restarts=2))
        await h.settle()
        assert not_serving(h) == [("p2", "FlapBackoff")]
        h.timer.advance(39.9)  # 10 s x 2^2
        await h.settle()
        assert members(h) == ["p1"]
        h.timer.advance(0.1)
        await h.settle()
        assert members(h) == ["p1", "p2"]


def test_the_wait_doubles_per_restart_up_to_its_bound_and_forgets_old_restarts() -> None:
    fresh = PodInfo("p", ready_since=EPOCH, restarts=0)
    assert ready_wait(fresh, 30, EPOCH) == 30
    assert ready_wait(replace(fresh, restarts=1, restarted_at=EPOCH), 30, EPOCH) == 60
    assert ready_wait(replace(fresh, restarts=50, restarted_at=EPOCH), 30, EPOCH) == 30 * MAX_FLAP_FACTOR
    old = replace(fresh, restarts=50, restarted_at=EPOCH - FLAP_WINDOW)
    assert ready_wait(old, 30, EPOCH) == 30
    assert ready_wait(replace(fresh, restarts=5, restarted_at=EPOCH), 0, EPOCH) == 0


def test_the_informer_keeps_when_a_pod_turned_ready_and_its_restarts() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "p", "labels": {"app": "g"}},
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2027-01-15T08:00:00Z"}],
            "containerStatuses": [
                {
                    "name": "app",
                    "restartCount": 3,
                    "lastState": {"terminated": {"finishedAt": "2027-01-15T07:59:50Z"}},
                },
                {"name": "mqbalance-sidecar", "restartCount": 1},
            ],
        },
    }
    info = pod_info(body)
    assert info.ready_since == datetime(2027, 1, 15, 8, 0, tzinfo=UTC).timestamp()
    assert info.restarted_at == info.ready_since - 10
    assert info.restarts == 4


def crash_loop_generations(min_ready: int, minutes: float = 5, every: float = 20, down: float = 5) -> int:
    """Generations published while one of three pods crashes every ``every`` seconds (it is Ready for
    ``every - down`` s, then not Ready ``down`` s while its container restarts), for ``minutes``."""

    async def run() -> int:
        async with Harness() as h:
            await start(h, group(debounce=0.0, minReadySeconds=min_ready), [pod("p1"), pod("p2")])
            first = len(h.journal.records)
            restarts = 0
            flapping = ready_pod(h, "p3")
            h.world.on_pod((NS, "p3"), None, flapping)
            await h.settle()
            elapsed = 0.0
            while elapsed < minutes * 60:
                h.timer.advance(every - down)
                await h.settle()
                crashed = replace(flapping, ready=False, restarted_at=EPOCH + h.timer.time)
                h.world.on_pod((NS, "p3"), flapping, crashed)
                await h.settle()
                h.timer.advance(down)
                await h.settle()
                restarts += 1
                back = replace(ready_pod(h, "p3", restarts), restarted_at=crashed.restarted_at)
                h.world.on_pod((NS, "p3"), crashed, back)
                await h.settle()
                flapping = back
                elapsed += every
            return len(h.journal.records) - first

    return asyncio.run(run())


def test_a_crash_looping_pod_no_longer_moves_queues_at_every_restart() -> None:
    before = crash_loop_generations(0)
    after = crash_loop_generations(30)
    print(f"generations in 5 min, a pod crashing every 20 s: minReadySeconds 0: {before}, 30: {after}")
    assert before >= 2 * 14  # a join and a leave per restart
    assert after <= 2  # it may join before its first crash, then never again
