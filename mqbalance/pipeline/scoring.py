"""Per-group totals and the recommended strategy.

The score of a strategy for a group is a cost per replayed event, in units of
one queue move:

    cost = (moved - minimum_moves)                   # moves beyond the fewest balance allows
         + spread_weight * max(spread - 1, 0)        # load beyond "differ by at most one"
         + zone_weight   * cross_zone                # holdings outside the broker's zone
         + unassigned_weight * unassigned            # queues nobody holds
         + load_weight   * max(load_spread - 1, 0)   # busiest member's rate beyond the mean's

summed over the group's events and divided by their number. A move is a pause
and a burst of duplicates for one queue, paid once. An extra queue on the busiest
consumer lasts until the next event, so by default one unit of excess spread
weighs as much as one extra move (``spread_weight = 1``). A cross-zone holding
costs network traffic, not a pause, so it weighs less (``zone_weight = 0.25``).
A queue nobody holds piles up a backlog for as long as it stays unheld, like an
extra queue on a busy consumer (``unassigned_weight = 1``); only CONFIG and
MACHINE_ROOM leave queues out, and for their groups the other candidates show what
the same members would do if they consumed every queue.
Where events carry per-queue rates, ``load_spread`` is the busiest member's rate over
the mean member's: a busiest member at twice the mean for one event weighs as one
extra move (``load_weight = 1``); without rates it is 0 and costs nothing.
Moving fewer queues than the balanced minimum gives a negative first term, which
is how a strategy that trades balance for stability (CONSISTENT_HASH) is weighed
against its spread.

The recommended strategy has the lowest cost; ties (within 1e-9) go to the
strategy the group already runs, then to the earlier one in the candidate order.
The gain of switching is ``(cost of current - cost of recommended) * events``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mqbalance.pipeline.replay import CANDIDATE_LABELS, FigureRow

TIE = 1e-9


@dataclass(frozen=True)
class Weights:
    spread: float = 1.0
    zone: float = 0.25
    unassigned: float = 1.0
    load: float = 1.0

    def __post_init__(self) -> None:
        for name in ("spread", "zone", "unassigned", "load"):
            if getattr(self, name) < 0:
                raise ValueError(f"scoring weight {name} must not be negative, got {getattr(self, name)}")


class StrategyTotals(NamedTuple):
    """One strategy's figures over one group's events."""

    namespace: str
    group: str
    strategy: str
    events: int
    moved: int
    forced: int
    minimum_moves: int
    spread_sum: int
    excess_spread: int
    """Sum of max(spread - 1, 0)."""
    max_spread: int
    cross_zone: int
    unassigned: int
    held: int
    last_time: float
    last_seq: int
    last_current: bool
    """Whether the group ran this strategy at the strategy's last replayed event."""
    load_spread_sum: float = 0.0
    """Sum of the events' ``load_spread`` (0 at events without rates)."""
    excess_load_spread: float = 0.0
    """Sum of max(load_spread - 1, 0)."""
    max_load_spread: float = 0.0


TOTALS_SCHEMA = (
    "namespace string, group string, strategy string, events long, moved long, forced long, "
    "minimum_moves long, spread_sum long, excess_spread long, max_spread long, cross_zone long, "
    "unassigned long, held long, last_time double, last_seq long, last_current boolean, "
    "load_spread_sum double, excess_load_spread double, max_load_spread double"
)


def totals(rows: Iterable[FigureRow]) -> list[StrategyTotals]:
    """Group × strategy totals, sorted by (namespace, group, strategy)."""
    by_key: dict[tuple[str, str, str], list[FigureRow]] = {}
    for row in rows:
        by_key.setdefault((row.namespace, row.group, row.strategy), []).append(row)
    out = []
    for (namespace, group, strategy), group_rows in sorted(by_key.items()):
        last = max(group_rows, key=lambda r: (r.time, r.seq))
        out.append(
            StrategyTotals(
                namespace,
                group,
                strategy,
                len(group_rows),
                sum(r.moved for r in group_rows),
                sum(r.forced for r in group_rows),
                sum(r.minimum_moves for r in group_rows),
                sum(r.spread for r in group_rows),
                sum(max(r.spread - 1, 0) for r in group_rows),
                max(r.spread for r in group_rows),
                sum(r.cross_zone for r in group_rows),
                sum(r.unassigned for r in group_rows),
                sum(r.held for r in group_rows),
                last.time,
                last.seq,
                last.current,
                math.fsum(r.load_spread for r in group_rows),
                math.fsum(max(r.load_spread - 1, 0.0) for r in group_rows),
                max(r.load_spread for r in group_rows),
            )
        )
    return out


def cost(t: StrategyTotals, weights: Weights) -> float:
    """Cost per event (see the module docstring)."""
    total = (
        t.moved
        - t.minimum_moves
        + weights.spread * t.excess_spread
        + weights.zone * t.cross_zone
        + weights.unassigned * t.unassigned
        + weights.load * t.excess_load_spread
    )
    return total / t.events if t.events else 0.0


class GroupSummary(NamedTuple):
    namespace: str
    group: str
    events: int
    current: str
    recommended: str
    current_cost: float
    recommended_cost: float
    gain: float
    """(current_cost - recommended_cost) * events: what switching would have saved."""
    moves_saved: int
    cross_zone_saved: int


SUMMARY_SCHEMA = (
    "namespace string, group string, events long, current string, recommended string, "
    "current_cost double, recommended_cost double, gain double, moves_saved long, cross_zone_saved long"
)


def _order(label: str) -> int:
    return CANDIDATE_LABELS.index(label) if label in CANDIDATE_LABELS else len(CANDIDATE_LABELS)


def recommend(group_totals: Sequence[StrategyTotals], weights: Weights) -> GroupSummary:
    """The summary of one group from its strategies' totals."""
    if not group_totals:
        raise ValueError("recommend needs the totals of at least one strategy")
    current = max(group_totals, key=lambda t: (t.last_current, t.last_time, t.last_seq, -_order(t.strategy)))
    costs = {t.strategy: cost(t, weights) for t in group_totals}
    best = min(
        group_totals,
        key=lambda t: (
            round(costs[t.strategy] / TIE),
            t.strategy != current.strategy,
            _order(t.strategy),
            t.strategy,
        ),
    )
    events = max(t.events for t in group_totals)
    return GroupSummary(
        current.namespace,
        current.group,
        events,
        current.strategy,
        best.strategy,
        costs[current.strategy],
        costs[best.strategy],
        (costs[current.strategy] - costs[best.strategy]) * events,
        current.moved - best.moved,
        current.cross_zone - best.cross_zone,
    )


def summaries(all_totals: Iterable[StrategyTotals], weights: Weights) -> list[GroupSummary]:
    """One summary per group, in (namespace, group) order."""
    ordered = sorted(all_totals, key=lambda t: (t.namespace, t.group))
    return [
        recommend(list(group), weights)
        for _, group in itertools.groupby(ordered, key=lambda t: (t.namespace, t.group))
    ]
