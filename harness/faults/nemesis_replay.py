"""What every candidate strategy would have moved in each round of a nemesis run: the operator's
journal replayed as ``mqbalance replay`` does (``mqbalance.pipeline.replay``), its figures summed
per round. A round runs from its start to the next round's start (its heal and settling included);
what came before the first round is the set-up.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from harness.demo.report import table
from mqbalance.journal import JournalRecord
from mqbalance.pipeline.events import event_from_record
from mqbalance.pipeline.replay import replay
from mqbalance.pipeline.report import strategy_order

SET_UP = "set-up"


@dataclass
class RoundMoves:
    fault: str
    events: int = 0
    """Journal records (generations published) in the round, every group's."""
    moved: Counter[str] = field(default_factory=Counter)
    """Strategy label -> queues it would have moved."""
    unbalanced: set[str] = field(default_factory=set)
    """Strategies that left loads more than one queue apart at a generation of the round."""

    def fewest(self) -> list[str]:
        """The balanced strategies that would have moved the fewest queues (moving nothing is
        easy for a strategy that leaves a member idle)."""
        balanced = {s: n for s, n in self.moved.items() if s not in self.unbalanced}
        least = min(balanced.values(), default=None)
        return sorted((s for s, n in balanced.items() if n == least), key=strategy_order)


def round_moves(records: Iterable[JournalRecord], rounds: Sequence[tuple[str, float]]) -> list[RoundMoves]:
    """``rounds``: (fault, start) in order. Each group's journal is replayed whole, so every
    strategy starts a round from its own previous assignment, as it would have run."""
    starts = [start for _, start in rounds]
    out = [RoundMoves(SET_UP)] + [RoundMoves(fault) for fault, _ in rounds]
    for row in replay(event_from_record(record) for record in records):
        one = out[bisect.bisect_right(starts, row.time)]
        one.moved[row.strategy] += row.moved
        if row.spread > 1:
            one.unbalanced.add(row.strategy)
        if row.current:  # one row per event is the strategy the group ran
            one.events += 1
    return out


def moves_table(found: Sequence[RoundMoves]) -> str:
    labels = sorted({s for one in found for s in one.moved}, key=strategy_order)
    rows = [
        [
            one.fault,
            str(one.events),
            *(f"{one.moved[s]}{'*' if s in one.unbalanced else ''}" for s in labels),
            ", ".join(one.fewest()) or "-",
        ]
        for one in found
    ]
    note = "  * loads more than one queue apart at a generation of the round; FEWEST counts the others"
    return table(["ROUND", "GENERATIONS", *labels, "FEWEST"], rows) + "\n" + note
