"""The trace of a move as the sidecar sees it: its steps timed from the generation's receipt."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from pytest_aiohttp import AiohttpClient

from mqbalance.contract import HandoverMode
from mqbalance.producer import Generation, QueueSelector
from mqbalance.sidecar.app import create_app
from mqbalance.sidecar.moves import KIND, MoveTrace, reported_steps
from mqbalance.sidecar.state import SidecarState
from tests.unit.sidecar.sidecar_support import OTHER, POD, Client, FakeClock, document, make_config, state_of
from tests.unit.sidecar.test_sidecar_handover import Recorder, revoking


class Seen:
    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []
        self.lines: list[dict[str, object]] = []

    def observe(self, step: str, seconds: float) -> None:
        self.steps.append((step, round(seconds, 6)))

    def log(self, line: str) -> None:
        self.lines.append(json.loads(line))


def trace(clock: FakeClock) -> tuple[MoveTrace, Seen]:
    seen = Seen()
    return MoveTrace("orders", seen.observe, seen.log, clock), seen


async def served(
    aiohttp_client: AiohttpClient, clock: FakeClock, recorder: Recorder
) -> tuple[SidecarState, Client]:
    """The sidecar's state on ``clock`` as its wall and its monotonic clock, and a client of its API."""
    config = make_config()
    selector = QueueSelector(generation=Generation.V5, clock=clock.ms, rng=random.Random(7), index_start=0)
    state = SidecarState(config.pod_name, config.groups, selector, clock=clock, monotonic=clock)
    client = await aiohttp_client(create_app(config, source=None, state=state, recorder=recorder))  # type: ignore[arg-type]
    return state, client


def test_each_step_is_timed_from_the_receipt_once_and_the_move_is_logged() -> None:
    clock = FakeClock(100.0)
    moves, seen = trace(clock)
    moves.began(7, gained=0, revoked=2, propagation=0.02)
    clock.advance(0.03)
    moves.read(7)
    moves.read(7)  # a second answer of the same generation is no step
    clock.advance(0.2)
    moves.released(7, {"appliedMs": 50.0, "committedMs": 180.0})
    clock.advance(0.01)
    moves.recorded(7)
    assert seen.steps == [
        ("read", 0.03),
        ("applied", 0.08),  # the helper's 50 ms after the read
        ("committed", 0.21),
        ("released", 0.23),
        ("recorded", 0.24),
    ]
    assert seen.lines == [
        {
            "kind": KIND,
            "group": "orders",
            "generation": 7,
            "gained": 0,
            "revoked": 2,
            "propagationMs": 20.0,
            "readMs": 30.0,
            "appliedMs": 80.0,
            "committedMs": 210.0,
            "releasedMs": 230.0,
            "recordedMs": 240.0,
        }
    ]
    assert moves.current is None


def test_what_is_no_move_or_not_its_generation_times_nothing() -> None:
    clock = FakeClock()
    moves, seen = trace(clock)
    moves.began(3, gained=0, revoked=0, propagation=None)  # the pod's queues did not change
    moves.read(3)
    assert moves.current is None
    moves.began(4, gained=1, revoked=0, propagation=None)
    clock.advance(1)
    moves.read(3)  # an answer of an older generation (a long-poll decided before)
    moves.released(3, {"appliedMs": 1.0})
    assert seen.steps == []
    moves.released(4, {"appliedMs": 1.0})  # reported steps count from the read, which did not happen
    assert seen.steps == [("released", 1.0)]
    # A move is logged when the next one replaces it, or as it stands when the sidecar stops.
    moves.began(5, gained=0, revoked=1, propagation=None)
    assert [line["generation"] for line in seen.lines] == [4]
    moves.flush()
    moves.flush()
    assert [line["generation"] for line in seen.lines] == [4, 5]
    assert seen.lines[0] == {
        "kind": KIND,
        "group": "orders",
        "generation": 4,
        "gained": 1,
        "revoked": 0,
        "releasedMs": 1000.0,
    }


def test_reported_steps_are_milliseconds_from_zero_to_a_day() -> None:
    assert reported_steps({"generation": 4, "appliedMs": 3, "committedMs": 4.5}) == {
        "appliedMs": 3.0,
        "committedMs": 4.5,
    }
    assert reported_steps({"generation": 4}) == {}
    for bad in (-1, float("nan"), float("inf"), True, "5", 86_400_001):
        with pytest.raises(ValueError, match="appliedMs"):
            reported_steps({"appliedMs": bad})


@pytest.mark.asyncio
async def test_the_api_times_a_revoking_move_from_read_to_record(aiohttp_client: AiohttpClient) -> None:
    clock = FakeClock()
    recorder = Recorder()
    state, client = await served(aiohttp_client, clock, recorder)
    held = document(3, {"orders": {POD: [("broker-a", 0), ("broker-a", 1)], OTHER: [("broker-b", 0)]}})
    state_of(client).publish("orders", replace(held, handover=HandoverMode.RELEASE))
    clock.advance(5)
    state.publish("orders", revoking(4))  # broker-a:1 revoked from this pod
    clock.advance(0.04)
    assert (await client.get("/v1/queues")).status == 200
    clock.advance(0.1)
    for bad in ({"generation": 4, "appliedMs": -3}, {"generation": 4, "committedMs": "7"}):
        resp = await client.post("/v1/release", json=bad)
        assert resp.status == 400, bad
        assert "must be" in (await resp.json())["error"]
    resp = await client.post("/v1/release", json={"generation": 4, "appliedMs": 20, "committedMs": 90})
    assert resp.status == 200, await resp.text()

    def seconds(step: str) -> float | None:
        labels = {"group": "orders", "step": step}
        return state.metrics.registry.get_sample_value("mqbalance_sidecar_move_step_seconds_sum", labels)

    assert {step: round(seconds(step) or -1, 6) for step in ("read", "applied", "committed", "released")} == {
        "read": 0.04,
        "applied": 0.06,
        "committed": 0.13,
        "released": 0.14,
    }
    assert seconds("recorded") == pytest.approx(0.14)
    assert len(recorder.acks) == 1


def test_a_gaining_move_waits_for_its_first_consumption_before_it_is_logged() -> None:
    clock = FakeClock(0.0)
    moves, seen = trace(clock)
    moves.began(8, gained=2, revoked=0, propagation=0.01)
    assert not moves.consumed(8, 5.0), "not read yet: nothing to count from"
    clock.advance(0.002)
    moves.read(8)
    clock.advance(0.01)
    moves.released(8, {})
    moves.recorded(8)
    assert seen.lines == [], "its first consumption is still to come"
    assert not moves.consumed(7, 100.0), "another generation's"
    assert moves.consumed(8, 150.0, pulled_ms=20.0)
    assert not moves.consumed(8, 300.0), "counted once"
    assert seen.steps[-2:] == [("pulled", 0.022), ("consumed", 0.152)]
    assert [(line["generation"], line["pulledMs"], line["consumedMs"]) for line in seen.lines] == [
        (8, 22.0, 152.0)
    ]


@pytest.mark.asyncio
async def test_the_first_consumption_is_reported_through_the_api(aiohttp_client: AiohttpClient) -> None:
    clock = FakeClock()
    state, client = await served(aiohttp_client, clock, Recorder())
    state.publish("orders", document(3, {"orders": {OTHER: [("broker-a", 0), ("broker-a", 1)]}}))
    state.publish("orders", document(4))  # broker-a:0 and broker-a:1 come to this pod
    clock.advance(0.01)
    assert (await client.get("/v1/queues")).status == 200
    for bad in (
        {"generation": 4},
        {"consumedMs": 3},
        {"generation": 4, "consumedMs": -1},
        {"generation": 4, "consumedMs": 3, "pulledMs": "soon"},
        {"generation": 4, "x": 1},
    ):
        resp = await client.post("/v1/trace", json=bad)
        assert resp.status == 400, bad
    resp = await client.post("/v1/trace", json={"generation": 4, "pulledMs": 30, "consumedMs": 90})
    assert await resp.json() == {"group": "orders", "generation": 4, "traced": True}
    for step, seconds in (("pulled", 0.04), ("consumed", 0.1)):
        assert state.metrics.registry.get_sample_value(
            "mqbalance_sidecar_move_step_seconds_sum", {"group": "orders", "step": step}
        ) == pytest.approx(seconds)
    again = await client.post("/v1/trace", json={"generation": 4, "consumedMs": 90})
    assert (await again.json())["traced"] is False
