"""The end-to-end benchmark's scoring (harness.e2e.score_variant) on hand-made records."""

from __future__ import annotations

import pytest

from harness.e2e import Record, score_variant

START_MS = 1_000_000.0


def test_lost_duplicates_order_and_gap() -> None:
    produced = {
        ("broker-a", 0, 0): ("k1", 0, 1_000_000),
        ("broker-a", 0, 1): ("k1", 1, 1_000_010),
        ("broker-a", 0, 2): ("k1", 2, 1_000_020),
        ("broker-b", 1, 0): ("k2", 0, 1_000_030),
    }
    records: list[Record] = [
        (1_000_100, "broker-a", 0, 0, "k1", 0, "c0"),
        (1_000_200, "broker-a", 0, 2, "k1", 2, "c0"),  # seq 2 before seq 1: one order violation
        (1_003_200, "broker-a", 0, 1, "k1", 1, "c1"),  # 3 s after the previous one on broker-a:0
        (1_003_300, "broker-a", 0, 2, "k1", 2, "c1"),  # consumed again: a duplicate, not a violation
    ]  # broker-b:1 offset 0 never consumed: lost
    score = score_variant("x", produced, sorted(records), START_MS)
    assert score.lost == 1
    assert score.duplicates == 1
    assert score.order_violations == 1
    assert score.longest_gap_s == pytest.approx(3.0)
    assert score.gap_queue == "broker-a:0"
    assert score.gap_at_s == pytest.approx(0.2)
    assert score.consumed == 4
    # From each send to the first consumption: 100, 3,190 and 180 ms (the lost one has none).
    assert score.latency_ms == (180.0, 3190.0, 3190.0)


def test_nothing_wrong() -> None:
    produced = {("b", 0, i): ("k", i, 1_000_000) for i in range(3)}
    records: list[Record] = [(1_000_000 + 10 * i, "b", 0, i, "k", i, "c") for i in range(3)]
    score = score_variant("x", produced, records, START_MS)
    assert (score.lost, score.duplicates, score.order_violations) == (0, 0, 0)
    assert score.longest_gap_s == pytest.approx(0.01)


def test_only_this_runs_messages_count_and_duplicates_after_a_kill_are_told_apart() -> None:
    produced = {("b", 0, i): ("k", i, 1_000_000) for i in range(10, 14)}
    records: list[Record] = [
        (1_000_000, "b", 0, 3, "k", 40, "c0"),  # an earlier run's message: ignored
        (1_000_010, "b", 0, 10, "k", 0, "c0"),
        (1_000_020, "b", 0, 11, "k", 1, "c0"),  # c0 is SIGKILLed before committing 11
        (1_000_030, "b", 0, 11, "k", 1, "c1"),
        (1_000_040, "b", 0, 12, "k", 2, "c1"),
        (1_000_050, "b", 0, 12, "k", 2, "c2"),  # a live rebalance: c1 and c2 both consumed 12
        (1_000_060, "b", 0, 13, "k", 3, "c2"),
    ]
    score = score_variant("x", produced, records, START_MS, killed={"c0"})
    assert (score.consumed, score.lost, score.order_violations) == (6, 0, 0)
    assert (score.duplicates, score.duplicates_after_kill) == (2, 1)
