"""The nemesis journal's replay per round (harness.faults.nemesis_replay) on a planted journal."""

from __future__ import annotations

from collections import Counter

from harness.faults.nemesis_replay import SET_UP, RoundMoves, moves_table, round_moves
from mqbalance.journal import JournalRecord
from mqbalance.model import MessageQueue, StrategyName, StrategySpec

QUEUES = [MessageQueue("orders", "broker-a", i) for i in range(12)]
ZONE = {"p0": "zone-a", "p1": "zone-a", "p2": "zone-a"}


def record(generation: int, time: float, *members: str, group: str = "orders") -> JournalRecord:
    """A generation of ``members`` (its assignment does not matter: the replay recomputes it)."""
    return JournalRecord(
        namespace="shop",
        group=group,
        generation=generation,
        time=time,
        reason="member-left",
        strategy=StrategySpec(StrategyName.STICKY),
        message_model="CLUSTERING",
        members={m: ZONE[m] for m in members},
        broker_zones={"broker-a": "zone-a"},
        queues={"orders": QUEUES},
        assignment={"orders": {}},
        moved=0,
        compute_seconds=0.0,
    )


def test_each_rounds_moves_per_strategy_and_the_fewest() -> None:
    journal = [
        record(1, 1.0, "p0", "p1", "p2"),
        record(2, 10.0, "p1", "p2"),  # p0 cut off in the first round
        record(3, 12.0, "p0", "p1", "p2"),  # back before the second round starts
        record(4, 20.0, "p0", "p1"),  # p2 killed in the second round
        record(1, 2.0, "p0", "p1", group="payments"),  # another group: counted in the set-up
    ]
    found = round_moves(journal, [("partition", 9.0), ("sigkill", 20.0)])
    assert [(r.fault, r.events) for r in found] == [(SET_UP, 2), ("partition", 2), ("sigkill", 1)]
    assert set(found[0].moved.values()) == {0}  # a first generation moves nothing
    # p0's 4 queues go (forced) and 4 come back: STICKY moves exactly those; AVG's blocks shift.
    assert found[1].moved["STICKY"] == 8
    assert found[1].moved["AVG"] > 8
    assert found[2].moved["STICKY"] == 4
    assert "STICKY" in found[1].fewest()
    assert "AVG" not in found[2].fewest()
    text = moves_table(found).splitlines()
    assert text[0].split()[:3] == ["ROUND", "GENERATIONS", "AVG"]
    assert text[2].split()[:3] == ["partition", "2", str(found[1].moved["AVG"])]


def test_the_fewest_counts_only_strategies_that_kept_loads_balanced() -> None:
    # Moving nothing is easy for a strategy that leaves a member idle (MACHINE_ROOM_NEARBY with
    # every broker in one zone): it is starred, not the fewest.
    one = RoundMoves(
        "partition", 3, Counter({"MACHINE_ROOM_NEARBY": 0, "STICKY": 4, "AVG": 6}), {"MACHINE_ROOM_NEARBY"}
    )
    assert one.fewest() == ["STICKY"]
    row = moves_table([one]).splitlines()[1].split()
    assert row == ["partition", "3", "6", "0*", "4", "STICKY"]
    assert RoundMoves("idle", 0, Counter({"AVG": 0}), {"AVG"}).fewest() == []
