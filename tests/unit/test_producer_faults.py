"""Latency fault tolerance against RocketMQ's MQFaultStrategy tables, driven by a fake clock."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.producer import (
    LATENCY_4X,
    LATENCY_5X,
    FaultTable,
    LatencyFaultTolerance,
    fault_table,
    java_latency,
    monotonic_ms,
    wall_ms,
)

# The arrays as they stand in RocketMQ's MQFaultStrategy.java, copied here rather than read
# from the module under test.
JAVA_4X = ((50, 100, 550, 1000, 2000, 3000, 15000), (0, 0, 30000, 60000, 120000, 180000, 600000))
JAVA_5X = ((50, 100, 550, 1800, 3000, 5000, 15000), (0, 0, 2000, 5000, 6000, 10000, 30000))
ROWS = [(LATENCY_4X, lat, dur) for lat, dur in zip(*JAVA_4X, strict=True)] + [
    (LATENCY_5X, lat, dur) for lat, dur in zip(*JAVA_5X, strict=True)
]


class FakeClock:
    """Integer milliseconds that move only when a test says so."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
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
    clock = FakeClock(1_000_000)
    faults = LatencyFaultTolerance(table, clock=clock)
    item = faults.update("broker-a", latency)
    until = 1_000_000 + duration
    # 5.x creates an item that is never isolated with startTimestamp 0.
    assert item.isolated_until_ms == (0 if table.extend_only and duration == 0 else until)
    assert item.current_latency_ms == latency
    if duration > 0:
        assert not item.available
        assert item.isolated_for_ms == duration
        clock.now = until - 1
        assert not faults.is_available("broker-a")
        assert faults.item("broker-a").isolated_for_ms == 1  # type: ignore[union-attr]
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


@pytest.mark.parametrize(("table", "window_ms"), [(LATENCY_4X, 600_000), (LATENCY_5X, 10_000)])
def test_a_failure_isolates_for_the_tables_failure_window(table: FaultTable, window_ms: int) -> None:
    clock = FakeClock(50_000)
    faults = LatencyFaultTolerance(table, clock=clock)
    item = faults.update("broker-a", 3, failed=True)
    assert item.isolated_until_ms == 50_000 + window_ms
    assert item.current_latency_ms == 3  # the measured latency, not the penalty
    clock.now = 50_000 + window_ms - 1
    assert not faults.is_available("broker-a")
    clock.now = 50_000 + window_ms
    assert faults.is_available("broker-a")


def test_4x_overwrites_the_window_so_a_fast_send_lifts_it() -> None:
    clock = FakeClock()
    faults = LatencyFaultTolerance(LATENCY_4X, clock=clock)
    faults.update("a", 0, failed=True)
    clock.now += 1000
    assert not faults.is_available("a")
    faults.update("a", 10)
    assert faults.is_available("a")


def test_5x_only_lengthens_the_window() -> None:
    clock = FakeClock(0)
    faults = LatencyFaultTolerance(LATENCY_5X, clock=clock)
    faults.update("a", 0, failed=True)  # until 10 s
    clock.now = 1000
    faults.update("a", 10)  # fast: keeps the isolation
    assert not faults.is_available("a")
    faults.update("a", 600)  # 2 s from now, ends before 10 s: no change
    assert faults.item("a").isolated_until_ms == 10_000  # type: ignore[union-attr]
    clock.now = 9000
    faults.update("a", 15000)  # 30 s from now: lengthens
    assert faults.item("a").isolated_until_ms == 39_000  # type: ignore[union-attr]
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
    clock = FakeClock(100_000)
    faults = LatencyFaultTolerance(LATENCY_5X, clock=clock)
    faults.update("b", 700)
    faults.update("a", 20, failed=True, reachable=False)
    document = json.loads(json.dumps(faults.to_json()))
    assert document["table"]["name"] == "5.x"
    assert [b["broker"] for b in document["brokers"]] == ["a", "b"]
    assert document["brokers"][0] == {
        "broker": "a",
        "currentLatencyMs": 20,
        "isolatedUntilMs": 110_000,
        "isolatedForMs": 10_000,
        "available": False,
        "reachable": False,
    }
    assert document["brokers"][1]["isolatedForMs"] == 2000


def test_pick_one_at_least_takes_the_better_half_in_turn() -> None:
    clock = FakeClock(0)
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


@pytest.mark.parametrize("latency", [-1, -0.5, float("nan"), float("inf"), "12", True])
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


@pytest.mark.parametrize(
    ("report_ns", "check_ns"), [(1_000_400_000, 3_000_100_000), (999_999_999, 2_999_000_000)]
)
def test_a_window_ends_at_the_millisecond_java_says_whatever_the_sub_millisecond_part(
    monkeypatch: pytest.MonkeyPatch, report_ns: int, check_ns: int
) -> None:
    # Java truncates both instants to milliseconds (currentTimeMillis): a report at 1000.4 ms
    # starts a 2000 ms window that ends at 3000, and at 3000.1 ms the broker is available.
    # Seconds as floats kept the 0.4 ms and said "isolated" until 3000.4 ms.
    now = [report_ns]
    monkeypatch.setattr(time, "monotonic_ns", lambda: now[0])
    faults = LatencyFaultTolerance(LATENCY_5X, clock=monotonic_ms)
    item = faults.update("a", 600)
    assert item.isolated_until_ms == report_ns // 1_000_000 + 2000
    now[0] = check_ns - 1_000_000  # the millisecond before: still isolated
    assert not faults.is_available("a")
    now[0] = check_ns
    assert faults.is_available("a")


@settings(max_examples=300)
@given(
    origin=st.integers(-(2**62), 2**62),
    latency=st.sampled_from([550, 1800, 3000, 5000, 15000, 10**6]),
    table=st.sampled_from([LATENCY_4X, LATENCY_5X]),
)
def test_windows_are_exact_on_any_clock_origin(origin: int, latency: int, table: FaultTable) -> None:
    clock = FakeClock(origin)
    faults = LatencyFaultTolerance(table, clock=clock)
    window = table.not_available_duration(latency)
    faults.update("a", latency)
    clock.now = origin + window - 1
    assert not faults.is_available("a")
    assert faults.item("a").isolated_for_ms == 1  # type: ignore[union-attr]
    clock.now = origin + window
    assert faults.is_available("a")


def test_the_clocks_read_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_123_999_999)
    monkeypatch.setattr(time, "monotonic_ns", lambda: 5_999_999)
    assert wall_ms() == 1_700_000_000_123  # System.currentTimeMillis truncates too
    assert monotonic_ms() == 5


def test_a_clock_in_seconds_is_a_clear_error() -> None:
    faults = LatencyFaultTolerance(clock=time.monotonic)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="integer milliseconds"):
        faults.update("a", 1)


@pytest.mark.parametrize(
    ("reported", "stored"), [(0, 0), (12.999, 12), (549.9, 549), (550.0, 550), (2**63 - 1, 2**63 - 1)]
)
def test_latencies_are_java_longs_truncated(reported: float, stored: int) -> None:
    assert java_latency(reported) == stored
    faults = LatencyFaultTolerance(LATENCY_4X, clock=FakeClock())
    item = faults.update("a", reported)
    assert item.current_latency_ms == stored
    assert item.isolated_for_ms == LATENCY_4X.not_available_duration(stored)


def test_a_latency_beyond_a_java_long_is_refused() -> None:
    with pytest.raises(ValueError, match="Java long"):
        java_latency(2**63)
