"""Totals per group and strategy, the cost, and the recommendation."""

from __future__ import annotations

import pytest

from mqbalance.pipeline import synthetic
from mqbalance.pipeline.replay import FigureRow, replay
from mqbalance.pipeline.scoring import StrategyTotals, Weights, cost, recommend, summaries, totals


def row(strategy: str, seq: int, *, current: bool = False, **figures: int) -> FigureRow:
    values = dict.fromkeys(
        (
            "members",
            "queues",
            "held",
            "moved",
            "forced",
            "minimum_moves",
            "spread",
            "min_load",
            "max_load",
            "cross_zone",
            "unassigned",
        ),
        0,
    )
    values.update(figures)
    return FigureRow("ns", "g", seq, float(seq), "", strategy, current, **values)


def total(strategy: str, *, events: int = 4, last_current: bool = False, **figures: int) -> StrategyTotals:
    values = dict.fromkeys(
        (
            "moved",
            "forced",
            "minimum_moves",
            "spread_sum",
            "excess_spread",
            "max_spread",
            "cross_zone",
            "unassigned",
            "held",
        ),
        0,
    )
    values.update(figures)
    return StrategyTotals(
        "ns", "g", strategy, events, last_time=9.0, last_seq=9, last_current=last_current, **values
    )


def test_totals_sum_each_strategy_and_keep_the_last_event() -> None:
    rows = [
        row("AVG", 0, current=True, moved=0, spread=3, cross_zone=2, held=4),
        row("AVG", 2, current=False, moved=5, minimum_moves=2, spread=1, cross_zone=1, held=4, unassigned=1),
        row("AVG", 1, current=True, moved=1, forced=1, spread=0, held=4),
        row("STICKY", 0, moved=0, held=4),
    ]
    avg, sticky = totals(rows)
    assert avg == StrategyTotals(
        "ns",
        "g",
        "AVG",
        events=3,
        moved=6,
        forced=1,
        minimum_moves=2,
        spread_sum=4,
        excess_spread=2,
        max_spread=3,
        cross_zone=3,
        unassigned=1,
        held=12,
        last_time=2.0,
        last_seq=2,
        last_current=False,
    )
    assert (sticky.strategy, sticky.events) == ("STICKY", 1)


def test_cost_is_per_event_and_weighted() -> None:
    t = total("X", events=4, moved=10, minimum_moves=6, excess_spread=2, cross_zone=8, unassigned=1)
    assert cost(t, Weights()) == pytest.approx((4 + 2 + 0.25 * 8 + 1) / 4)
    assert cost(t, Weights(spread=0, zone=1, unassigned=0)) == pytest.approx((4 + 8) / 4)


def test_the_cheapest_strategy_is_recommended_with_its_gain() -> None:
    group = [
        total("AVG", moved=12, minimum_moves=4, cross_zone=12, last_current=True),
        total("STICKY", moved=4, minimum_moves=4, cross_zone=12),
        total("STICKY+zoneAffinity", moved=6, minimum_moves=4, cross_zone=0),
    ]
    summary = recommend(group, Weights())
    assert (summary.current, summary.recommended) == ("AVG", "STICKY+zoneAffinity")
    assert summary.current_cost == pytest.approx((8 + 3) / 4)
    assert summary.recommended_cost == pytest.approx(2 / 4)
    assert summary.gain == pytest.approx(9.0)
    assert (summary.moves_saved, summary.cross_zone_saved) == (6, 12)
    # Without a price on cross-zone traffic, the fewest moves win.
    assert recommend(group, Weights(zone=0)).recommended == "STICKY"


def test_ties_go_to_the_current_strategy_then_to_the_candidate_order() -> None:
    tied = [
        total("AVG", moved=4, minimum_moves=4),
        total("STICKY", moved=4, minimum_moves=4, last_current=True),
    ]
    assert recommend(tied, Weights()).recommended == "STICKY"
    summary = recommend(
        [
            total("STICKY", moved=4, minimum_moves=4),
            total("AVG", moved=4, minimum_moves=4),
            total("CONFIG", moved=9, last_current=True),
        ],
        Weights(),
    )
    assert summary.recommended == "AVG"


def test_the_current_strategy_is_the_one_run_at_the_last_event() -> None:
    earlier = total("CONFIG", events=2, last_current=True)._replace(last_time=1.0, last_seq=1)
    summary = recommend([earlier, total("AVG", last_current=True), total("STICKY")], Weights())
    assert summary.current == "AVG"
    assert summary.events == 4


def test_recommend_needs_totals() -> None:
    with pytest.raises(ValueError, match="at least one"):
        recommend([], Weights())


def test_negative_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="zone"):
        Weights(zone=-1)


def test_on_synthetic_churn_avg_is_never_better_than_sticky_when_zones_are_free() -> None:
    churn = synthetic.Churn(groups=6, events_per_group=20, seed=2)
    result = summaries(totals(replay(synthetic.events(churn))), Weights(zone=0))
    assert len(result) == 6
    for s in result:
        assert s.current == "AVG"
        assert s.recommended != "AVG" or s.gain == 0
        assert s.gain >= 0
