"""What a handover costs (harness.e2e_moves): moves read from hand-made journal lines."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from harness.e2e_moves import figures, journal_moves, move_lines, trace_figures, with_first_consumption
from mqbalance.contract import Release
from mqbalance.journal import JournalRecord
from mqbalance.model import MessageQueue, StrategyName, StrategySpec

Q0, Q1 = MessageQueue("t", "b", 0), MessageQueue("t", "b", 1)


def line(
    generation: int,
    time: float,
    held: Mapping[str, Sequence[MessageQueue]],
    releasing: Sequence[Release] = (),
) -> JournalRecord:
    return JournalRecord(
        namespace="ns",
        group="g",
        generation=generation,
        time=time,
        reason="",
        strategy=StrategySpec(StrategyName.STICKY),
        message_model="CLUSTERING",
        members={m: "z" for m in held},
        broker_zones={},
        queues={"t": [Q0, Q1]},
        assignment={"t": {m: tuple(qs) for m, qs in held.items()}},
        moved=0,
        compute_seconds=0.0,
        releasing=tuple(releasing),
    )


def test_one_step_and_two_step_moves_and_when_the_new_owner_first_consumed() -> None:
    journal = [
        line(1, 100.0, {"a": [Q0, Q1]}),
        # one step: q1 goes from a to b at 110
        line(2, 110.0, {"a": [Q0], "b": [Q1]}),
        # two steps: q0 revoked from a at 120, assigned to c at 121.5
        line(3, 120.0, {"a": [], "b": [Q1], "c": []}, [Release("a", 3, 120.0, (Q0,))]),
        line(4, 121.5, {"a": [], "b": [Q1], "c": [Q0]}),
        # another group's line is ignored
        replace(line(5, 122.0, {"x": [Q0]}), group="other"),
    ]
    moves = journal_moves(journal, "g", "t")
    assert [(m.queue, m.old, m.new, m.held_from, m.taken_at, m.assigned_at) for m in moves] == [
        (("b", 1), "a", "b", 100.0, 110.0, 110.0),
        (("b", 0), "a", "c", 100.0, 120.0, 121.5),
    ]
    consumed = [
        (105_000, "b", 1, "a"),  # the old owners consumed what they held
        (119_000, "b", 0, "a"),
        (109_000, "b", 1, "b"),  # before the move: not counted
        (110_800, "b", 1, "b"),
        (111_000, "b", 1, "b"),
        (121_000, "b", 0, "a"),  # the old owner finishing up
        (122_250, "b", 0, "c"),
    ]
    timed = with_first_consumption(moves, consumed)
    assert [m.unconsumed_s for m in timed] == [pytest.approx(0.8), pytest.approx(2.25)]
    assert [m.waited_s for m in timed] == [0.0, 1.5]
    f = figures(timed)
    assert (f.moves, f.waited_median_s) == (2, 0.75)
    assert f.unconsumed_max_s == pytest.approx(2.25)
    assert f.unconsumed_median_s == pytest.approx((0.8 + 2.25) / 2)


def test_moves_away_from_members_that_stayed_are_told_apart_from_a_leaving_members() -> None:
    journal = [
        line(1, 100.0, {"a": [Q0], "b": [Q1]}),
        line(2, 110.0, {"b": [Q0, Q1]}),  # a left, its queue moved in one step
        line(3, 120.0, {"b": [Q0], "c": []}, [Release("b", 3, 120.0, (Q1,))]),  # c joined
        line(4, 121.0, {"b": [Q0], "c": [Q1]}),
    ]
    consumed = [
        (105_000, "b", 0, "a"),
        (105_000, "b", 1, "b"),
        (111_000, "b", 0, "b"),
        (122_000, "b", 1, "c"),
    ]
    moves = with_first_consumption(journal_moves(journal, "g", "t"), consumed)
    f = figures(moves, left={"a": 109.0})
    assert (f.moves, f.waited_median_s) == (2, 0.5)
    assert (f.staying, f.staying_waited_min_s) == (1, 1.0)
    # Not told who left, or told a's leaving began after the move, the one-step move counts as a
    # move away from a member that stayed.
    for f in (figures(moves), figures(moves, left={"a": 111.0})):
        assert (f.staying, f.staying_waited_min_s) == (2, 0.0)


def test_killed_owners_queues_given_back_and_moves_outside_the_window_do_not_count() -> None:
    journal = [
        line(1, 100.0, {"a": [Q0], "b": [Q1]}),
        line(2, 105.0, {"b": [Q0, Q1]}),  # a was SIGKILLed
        # q1 revoked from b, then given back to b: no move
        line(3, 110.0, {"b": [Q0], "c": []}, [Release("b", 3, 110.0, (Q1,))]),
        line(4, 111.0, {"b": [Q0, Q1], "c": []}),
        line(5, 200.0, {"c": [Q0, Q1]}),  # after the producer stopped
    ]
    consumed = [
        (105_500, "b", 0, "b"),
        (150_000, "b", 1, "b"),
        (200_100, "b", 0, "c"),
        (200_100, "b", 1, "c"),
    ]
    moves = with_first_consumption(journal_moves(journal, "g", "t"), consumed)
    assert [(m.old, m.new, m.held_from) for m in moves] == [
        ("a", "b", 100.0),
        ("b", "c", 105.0),
        ("b", "c", 100.0),
    ]
    f = figures(moves, killed={"a"}, window=(90.0, 150.0))
    assert f.moves == 0
    assert figures(moves, killed={"a"}).moves == 2
    # An old owner that never consumed the queue it held had nothing to hand over.
    idle = with_first_consumption(journal_moves(journal, "g", "t"), consumed[:1] + consumed[2:])
    assert [m.old_consumed for m in idle] == [False, True, False]
    assert figures(idle, killed={"a"}).moves == 1


def test_the_trace_is_the_median_of_each_step_the_revoking_and_the_gaining_apart() -> None:
    log = "\n".join(
        [
            "2026-11-29 10:00:00,000 INFO mqbalance.sidecar.state: group g: serving generation 3",
            '2026-11-29 10:00:00,001 INFO mqbalance.sidecar.state: {"kind":"mqbalance.move","group":"g",'
            '"generation":3,"gained":0,"revoked":2,"propagationMs":10.0,"readMs":2.0,"releasedMs":90.0}',
            '2026-11-29 10:00:00,002 INFO mqbalance.sidecar.state: {"kind":"mqbalance.move","group":"g",'
            '"generation":4,"gained":0,"revoked":1,"propagationMs":30.0,"readMs":4.0,"appliedMs":50.0}',
            '2026-11-29 10:00:00,003 INFO mqbalance.sidecar.state: {"kind":"mqbalance.move","group":"g",'
            '"generation":5,"gained":2,"revoked":0,"propagationMs":20.0,"readMs":7.0,"pulledMs":9.0}',
            '2026-11-29 10:00:00,004 INFO mqbalance.sidecar.state: {"kind":"mqbalance.move","group":"other",'
            '"generation":5,"gained":2,"revoked":0,"readMs":700.0}',
        ]
    )
    joined = (
        '2026-11-29 09:59:00,000 INFO mqbalance.sidecar.state: {"kind":"mqbalance.move","group":"g",'
        '"generation":2,"gained":3,"revoked":0,"readMs":5.0,"consumedMs":900.0}'
    )
    lines = move_lines(joined) + move_lines(log)
    assert len(lines) == 5
    assert [line["joined"] for line in lines] == [True, True, False, False, False]
    journal = [
        line(2, 0.5, {"a": [Q0]}),
        replace(line(3, 1.0, {"a": [Q0]}), since_change_seconds=0.004),
        replace(line(4, 2.0, {"a": [Q0]}), since_change_seconds=0.012),
        line(5, 3.0, {"a": [Q0]}),  # not measured
    ]
    trace = trace_figures(lines, journal, "g")
    assert trace.moves == 4
    assert trace.generation_ms == pytest.approx(8.0)
    assert trace.old_owner_ms["propagation"] == 20.0
    assert trace.old_owner_ms["read"] == 3.0
    assert trace.old_owner_ms["applied"] == 50.0  # one move reported it
    assert trace.old_owner_ms["released"] == 90.0
    assert math.isnan(trace.old_owner_ms["recorded"])
    assert trace.new_owner_ms["propagation"] == 20.0
    assert trace.new_owner_ms["read"] == 7.0
    assert trace.new_owner_ms["pulled"] == 9.0
    assert math.isnan(trace.new_owner_ms["consumed"])
    assert trace.joining_ms["consumed"] == 900.0, "a joining pod's first move apart"
    sending = trace_figures(lines, journal, "g", since=1.5)
    assert sending.moves == 2, "generations published before the producer started are left out"
    assert sending.generation_ms == pytest.approx(12.0)
    assert math.isnan(sending.joining_ms["consumed"])
