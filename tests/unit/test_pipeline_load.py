"""Per-queue rates in the replay: synthetic Zipf rates, the load-aware STICKY scored beside the
others, and the load-spread measure in the figures, the totals and the cost."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mqbalance.pipeline import synthetic
from mqbalance.pipeline.events import Event
from mqbalance.pipeline.main import main
from mqbalance.pipeline.replay import CANDIDATE_LABELS, LOAD_LABEL, FigureRow, load_spread, replay
from mqbalance.pipeline.scoring import StrategyTotals, Weights, cost, totals

SKEWED = synthetic.Churn(groups=12, events_per_group=25, queues=(4, 6), members=(3, 6), rate_skew=1.0, seed=5)


def test_rates_are_zipf_skewed_jittered_and_leave_the_churn_as_it_was() -> None:
    plain = list(synthetic.events(dataclasses.replace(SKEWED, rate_skew=0.0)))
    skewed = list(synthetic.events(SKEWED))
    assert [dataclasses.replace(e, rates={}) for e in skewed] == plain
    assert skewed == list(synthetic.events(SKEWED))  # deterministic
    for event in skewed:
        loads = event.loads()
        assert set(loads) == {mq for topic in event.topics for mq in event.queues_of(topic)}
        assert all(0 < rate <= 1000 * 1.1 for rate in loads.values())
    first = skewed[0].loads()
    assert max(first.values()) / min(first.values()) > 5  # Zipf: a few queues carry most
    # The same queue's rate changes from event to event, within the jitter.
    again = skewed[1].loads()
    common = set(first) & set(again)
    assert any(first[mq] != again[mq] for mq in common)
    assert all(again[mq] / first[mq] <= 1.1 / 0.9 + 1e-9 for mq in common)
    with pytest.raises(ValueError, match="rate jitter"):
        synthetic.Churn(rate_jitter=1.0)


def test_rates_travel_in_the_payload_only_when_there_are_some() -> None:
    event = next(synthetic.events(SKEWED))
    assert Event.from_row(*event.row()) == event
    assert "rates" in json.loads(event.payload())
    bare = dataclasses.replace(event, rates={})
    assert "rates" not in json.loads(bare.payload())


def test_load_spread_is_the_busiest_members_rate_over_the_mean() -> None:
    event = Event("ns", "g", 0, 0.0, queues={"t": {"b": [0, 1, 2]}}, rates={"t": {"b": [6.0, 1.0, 1.0]}})
    q0, q1, q2 = event.queues_of("t")
    assert load_spread({"a": (q0,), "b": (q1, q2)}, event.loads()) == pytest.approx(6 / 4)
    assert load_spread({"a": (q0, q1, q2), "b": ()}, event.loads()) == pytest.approx(2.0)
    assert load_spread({"a": (q0,)}, {}) == 0.0


def test_the_load_aware_sticky_is_replayed_where_rates_are_and_spreads_load_least() -> None:
    rows = list(replay(synthetic.events(SKEWED)))
    labels = {r.strategy for r in rows}
    assert labels == {*CANDIDATE_LABELS, LOAD_LABEL}
    assert LOAD_LABEL == "STICKY+zoneAffinity+load"
    assert all(r.load_spread >= 1 - 1e-9 for r in rows)
    by_label = {t.strategy: t for t in _merge(totals(rows))}
    load, sticky, avg = by_label[LOAD_LABEL], by_label["STICKY+zoneAffinity"], by_label["AVG"]
    assert load.load_spread_sum < sticky.load_spread_sum
    assert load.load_spread_sum < avg.load_spread_sum
    # Without rates nothing changes: no load-aware row, and every load spread is 0.
    plain = list(replay(synthetic.events(dataclasses.replace(SKEWED, rate_skew=0.0))))
    assert {r.strategy for r in plain} == set(CANDIDATE_LABELS)
    assert all(r.load_spread == 0.0 for r in plain)


def _merge(group_totals: list[StrategyTotals]) -> list[StrategyTotals]:
    """One line per strategy over every group (sums only)."""
    out: dict[str, StrategyTotals] = {}
    for t in group_totals:
        seen = out.get(t.strategy)
        out[t.strategy] = (
            t
            if seen is None
            else seen._replace(
                events=seen.events + t.events, load_spread_sum=seen.load_spread_sum + t.load_spread_sum
            )
        )
    return list(out.values())


def test_totals_and_cost_count_the_load_spread() -> None:
    def row(seq: int, spread: float) -> FigureRow:
        counts = dict.fromkeys(FigureRow._fields[7:-1], 0)
        return FigureRow("ns", "g", seq, float(seq), "", "X", False, **counts, load_spread=spread)

    (t,) = totals([row(0, 1.5), row(1, 0.0), row(2, 3.0)])
    assert (t.load_spread_sum, t.excess_load_spread, t.max_load_spread) == (4.5, 2.5, 3.0)
    assert cost(t, Weights()) == pytest.approx(2.5 / 3)
    assert cost(t, Weights(load=2.0)) == pytest.approx(5.0 / 3)
    assert cost(t, Weights(load=0.0)) == 0.0
    with pytest.raises(ValueError, match="load"):
        Weights(load=-1.0)


def test_the_command_line_takes_rate_skew_and_reports_load_spread(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [
        "--synthetic",
        "--groups",
        "3",
        "--events-per-group",
        "6",
        "--rate-skew",
        "1.2",
        "--out",
        str(out),
    ]
    assert main([*argv, "--single-process", "--load-weight", "0.5"]) == 0
    figures = pq.read_table(out / "figures")
    assert figures.num_rows == 3 * 6 * (len(CANDIDATE_LABELS) + 1)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["weights"]["load"] == 0.5
    spreads = {s["strategy"]: s["mean_load_spread"] for s in summary["strategies"]}
    assert set(spreads) == {*CANDIDATE_LABELS, LOAD_LABEL}
    assert all(value >= 1 for value in spreads.values())
