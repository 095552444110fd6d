"""Latency fault tolerance against RocketMQ's MQFaultStrategy tables, driven by a fake clock."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.producer import (
    LATENCY_4X,
    LATENCY_5X,
    FaultTable,
    LatencyFaultTolerance,
    fault_table,
)

# The arrays as they stand in RocketMQ's MQFaultStrategy.java, copied here rather than read
# from the module under test.
JAVA_4X = ((50, 100, 550, 1000, 2000, 3000, 15000), (0, 0, 30000, 60000, 120000, 180000, 600000))
JAVA_5X = ((50, 100, 550, 1800, 3000, 5000, 15000), (0, 0, 2000, 5000, 6000, 10000, 30000))
ROWS = [(LATENCY_4X, lat, dur) for lat, dur in zip(*JAVA_4X, strict=True)] + [
    (LATENCY_5X, lat, dur) for lat, dur in zip(*JAVA_5X, strict=True)
]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def java_lookup(java: tuple[tuple[int, ...], tuple[int, ...]], latency: float) -> int:
    for i in range(len(java[0]) - 1, -1, -1):
        if latency >= java[0][i]:
            return java[1][i]
    return 0


def test_tables_hold_rocketmqs_numbers() -> None:
    assert (LATENCY_4X.latency_max_ms, LATENCY_4X.not_available_duration_ms) == JAVA_4X
    assert (LATENCY_5X.latency_max_ms, LATENCY_5X.not_available_duration_ms) == JAVA_5X
    assert (LATENCY_4X.failure_latency_ms, LATENCY_5X.failure_latency_ms) == (30000, 10000)
    assert fault_table("4.x") is LATENCY_4X
    assert fault_table("5.x") is LATENCY_5X


@pytest.mark.parametrize(("table", "latency", "duration"), ROWS)
def test_each_row_isolates_until_exactly_start_plus_duration(
    table: FaultTable, latency: int, duration: int
) -> None:
    clock = FakeClock(1000.0)
    faults = LatencyFaultTolerance(table, clock=clock)
    item = faults.update("broker-a", latency)
    until = 1000.0 + duration / 1000.0
    assert item.isolated_until == until
    assert item.current_latency_ms == latency
    if duration > 0:
        assert not item.available
        assert item.isolated_for_ms == pytest.approx(duration)
        clock.now = math.nextafter(until, -math.inf)
        assert not faults.is_available("broker-a")
    clock.now = until
    assert faults.is_available("broker-a")
    assert faults.item("broker-a").isolated_for_ms == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(("table", "latency", "duration"), ROWS)
def test_latency_just_below_a_row_takes_the_row_beneath(
    table: FaultTable, latency: int, duration: int
) -> None:
    rows = list(zip(table.latency_max_ms, table.not_available_duration_ms, strict=True))
    position = rows.index((latency, duration))
    below = rows[position - 1][1] if position > 0 else 0
    assert table.not_available_duration(math.nextafter(latency, -math.inf)) == below
    assert table.not_available_duration(latency) == duration


@settings(max_examples=200)
@given(st.floats(min_value=0, max_value=100_000, allow_nan=False))
def test_lookup_agrees_with_javas_scan(latency: float) -> None:
    assert LATENCY_4X.not_available_duration(latency) == java_lookup(JAVA_4X, latency)
    assert LATENCY_5X.not_available_duration(latency) == java_lookup(JAVA_5X, latency)


@pytest.mark.parametrize(("table", "seconds"), [(LATENCY_4X, 600.0), (LATENCY_5X, 10.0)])
def test_a_failure_isolates_for_the_tables_failure_window(table: FaultTable, seconds: float) -> None:
    clock = FakeClock(50.0)
    faults = LatencyFaultTolerance(table, clock=clock)
    item = faults.update("broker-a", 3.0, failed=True)
    assert item.isolated_until == 50.0 + seconds
    assert item.current_latency_ms == 3.0  # the measured latency, not the penalty
    clock.now = math.nextafter(50.0 + seconds, -math.inf)
    assert not faults.is_available("broker-a")
    clock.now = 50.0 + seconds
    assert faults.is_available("broker-a")


def test_4x_overwrites_the_window_so_a_fast_send_lifts_it() -> None:
    clock = FakeClock()
    faults = LatencyFaultTolerance(LATENCY_4X, clock=clock)
    faults.update("a", 0, failed=True)
    clock.now += 1
    assert not faults.is_available("a")
    faults.update("a", 10)
    assert faults.is_available("a")


def test_5x_only_lengthens_the_window() -> None:
    clock = FakeClock(0.0)
    faults = LatencyFaultTolerance(LATENCY_5X, clock=clock)
    faults.update("a", 0, failed=True)  # until 10 s
    clock.now = 1.0
    faults.update("a", 10)  # fast: keeps the isolation
    assert not faults.is_available("a")
    faults.update("a", 600)  # 2 s from now, ends before 10 s: no change
    assert faults.item("a").isolated_until == 10.0  # type: ignore[union-attr]
    clock.now = 9.0
    faults.update("a", 15000)  # 30 s from now: lengthens
    assert faults.item("a").isolated_until == 39.0  # type: ignore[union-attr]
    assert faults.item("a").current_latency_ms == 15000  # type: ignore[union-attr]


def test_unknown_brokers_are_available_and_reachable() -> None:
    faults = LatencyFaultTolerance(clock=FakeClock())
    assert faults.is_available("nobody")
    assert faults.is_reachable("nobody")
    assert faults.item("nobody") is None
    assert faults.items() == []


def test_reachability_follows_reports_and_probes() -> None:
    faults = LatencyFaultTolerance(clock=FakeClock())
    faults.update("a", 5, failed=True, reachable=False)
    assert not faults.is_reachable("a")
    faults.mark_reachable("a")
    assert faults.is_reachable("a")
    faults.update("a", 5, reachable=False)
    assert not faults.is_reachable("a")
    faults.update("a", 5)
    assert faults.is_reachable("a")
    faults.mark_reachable("ghost")  # unknown: nothing to do
    assert faults.item("ghost") is None


def test_snapshot_is_json_friendly() -> None:
    clock = FakeClock(100.0)
    faults = LatencyFaultTolerance(LATENCY_5X, clock=clock)
    faults.update("b", 700)
    faults.update("a", 20, failed=True, reachable=False)
    document = json.loads(json.dumps(faults.to_json()))
    assert document["table"]["name"] == "5.x"
    assert [b["broker"] for b in document["brokers"]] == ["a", "b"]
    assert document["brokers"][0] == {
        "broker": "a",
        "currentLatencyMs": 20.0,
        "isolatedUntil": 110.0,
        "isolatedForMs": 10000.0,
        "available": False,
        "reachable": False,
    }
    assert document["brokers"][1]["isolatedForMs"] == pytest.approx(2000.0)


def test_pick_one_at_least_takes_the_better_half_in_turn() -> None:
    clock = FakeClock(0.0)
    faults = LatencyFaultTolerance(LATENCY_4X, clock=clock, worst_index_start=0)
    assert faults.pick_one_at_least() is None
    faults.update("slow", 2500)  # isolated 120 s
    assert faults.pick_one_at_least() == "slow"  # a single item is the answer
    faults.update("slower", 3500)  # isolated 180 s
    faults.update("ok", 20)  # available
    faults.update("fast", 10)  # available
    # Ranked: fast, ok (available, by latency), slow, slower; the better half is fast, ok.
    picks = [faults.pick_one_at_least() for _ in range(4)]
    assert picks == ["ok", "fast", "ok", "fast"]  # index 1, 2, 3, 4 modulo 2


@pytest.mark.parametrize("latency", [-1, float("nan"), "12"])
def test_bad_latency_is_refused(latency: object) -> None:
    faults = LatencyFaultTolerance(clock=FakeClock())
    with pytest.raises(ValueError, match="latency_ms must be a number >= 0"):
        faults.update("a", latency)  # type: ignore[arg-type]


def test_empty_broker_name_is_refused() -> None:
    with pytest.raises(ValueError, match="broker name"):
        LatencyFaultTolerance(clock=FakeClock()).update("", 1)


def test_bad_tables_are_refused() -> None:
    with pytest.raises(ValueError, match="equal length"):
        FaultTable("x", (1, 2), (0,), 10, True)
    with pytest.raises(ValueError, match="must ascend"):
        FaultTable("x", (2, 1), (0, 0), 10, True)
    with pytest.raises(ValueError, match=">= 0"):
        FaultTable("x", (1,), (-1,), 10, True)
    with pytest.raises(ValueError, match="unknown fault table"):
        fault_table("6.x")
