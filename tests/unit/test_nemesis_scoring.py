"""The nemesis suite's owner-side scoring (harness.faults.nemesis) on planted overlaps and gaps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from harness.faults.nemesis import (
    Batch,
    CutRun,
    FaultScore,
    Gap,
    Interval,
    Processed,
    Sent,
    Snapshots,
    gap_bound,
    gaps,
    in_flight,
    intervals,
    message_score,
    only_in_flight,
    overlaps,
    step_latency,
    table,
)

Q0, Q1 = "orders/broker-a:0", "orders/broker-a:1"


def _record(boot: float, *items: tuple[str, float, float, bool]) -> dict[str, Any]:
    return {
        "boot": boot,
        "intervals": [{"queue": q, "start": s, "end": e, "open": o} for q, s, e, o in items],
    }


def test_two_members_processing_one_queue_at_once_overlap() -> None:
    found = [
        Interval("p0", 1.0, Q0, 10.0, 20.0),
        Interval("p1", 1.0, Q0, 19.5, 30.0),  # planted: half a second of two owners
        Interval("p1", 1.0, Q1, 10.0, 30.0),
    ]
    (pair,) = overlaps(found)
    assert pair.queue == Q0
    assert {pair.first.member, pair.second.member} == {"p0", "p1"}
    assert pair.seconds == pytest.approx(0.5)
    assert pair.start == pytest.approx(19.5)


def test_touching_intervals_other_queues_and_one_members_runs_are_not_overlaps() -> None:
    found = [
        Interval("p0", 1.0, Q0, 10.0, 20.0),
        Interval("p1", 1.0, Q0, 20.0, 30.0),  # hand-on exactly at the end: no overlap
        Interval("p0", 1.0, Q1, 10.0, 30.0),
        Interval("p0", 2.0, Q1, 25.0, 35.0),  # the same pod's next run
    ]
    assert overlaps(found) == []


def test_an_overlap_before_the_round_is_left_to_its_own_round() -> None:
    found = [Interval("p0", 1.0, Q0, 0.0, 10.0), Interval("p1", 1.0, Q0, 9.0, 20.0)]
    assert len(overlaps(found)) == 1
    assert overlaps(found, since=10.0) == []
    assert len(overlaps(found, since=9.9)) == 1


def test_a_dead_runs_open_interval_lasts_until_it_was_known_dead() -> None:
    """A SIGKILLed app's open interval: the scorer must assume it processed until its first failed
    read, so the new owner starting before that is an overlap, not missed."""
    p0 = Snapshots("p0")
    p0.add(_record(1.0, (Q0, 10.0, 12.0, True)), at=12.0)
    p0.failed(at=14.0)
    p0.failed(at=15.0)  # the first failure counts
    p1 = Snapshots("p1")
    p1.add(_record(1.0, (Q0, 13.5, 20.0, True)), at=20.0)
    found = intervals([p0, p1], alive={"p0": False, "p1": True})
    dead = next(i for i in found if i.member == "p0")
    assert (dead.end, dead.open) == (14.0, False)
    (pair,) = overlaps(found)
    assert pair.seconds == pytest.approx(0.5)


def test_intervals_keep_the_generation_they_began_under() -> None:
    p0 = Snapshots("p0")
    record = _record(1.0, (Q0, 10.0, 12.0, True))
    record["intervals"][0]["generation"] = 7
    p0.add(record, at=12.0)
    (only,) = intervals([p0], alive={"p0": True})
    assert only.generation == 7


def test_a_restarted_container_ends_its_previous_runs_intervals_at_the_restart() -> None:
    p0 = Snapshots("p0")
    p0.add(_record(1.0, (Q0, 10.0, 12.0, True)), at=12.0)
    p0.add(_record(13.0, (Q0, 14.0, 15.0, True)), at=15.0)  # no failed read in between
    found = intervals([p0], alive={"p0": True})
    first = next(i for i in found if i.boot == 1.0)
    second = next(i for i in found if i.boot == 13.0)
    assert (first.end, first.open) == (13.0, False)
    assert (second.end, second.open) == (15.0, True)


def test_a_paused_run_that_answers_again_keeps_its_own_ends() -> None:
    p0 = Snapshots("p0")
    p0.add(_record(1.0, (Q0, 10.0, 12.0, True)), at=12.0)
    p0.failed(at=13.0)  # SIGSTOPped: no answer
    p0.add(_record(1.0, (Q0, 10.0, 12.1, False)), at=30.0)  # SIGCONT: it closed at its last batch
    (only,) = intervals([p0], alive={"p0": True})
    assert (only.end, only.open) == (12.1, False)


def test_gaps_find_the_longest_unprocessed_stretch_per_queue() -> None:
    found = [
        Interval("p0", 1.0, Q0, 0.0, 12.0),
        Interval("p1", 1.0, Q0, 19.0, 40.0),  # planted: 7 s unconsumed
        Interval("p1", 1.0, Q0, 20.0, 25.0),
        Interval("p0", 1.0, Q1, 0.0, 40.0),
    ]
    longest, other = gaps(found, [Q0, Q1], start=10.0, end=40.0)
    assert longest == Gap(Q0, 12.0, 19.0)
    assert other.seconds == 0


def test_gaps_at_the_edges_of_the_round_and_a_queue_nobody_processed() -> None:
    found = [Interval("p0", 1.0, Q0, 15.0, 30.0)]
    assert gaps(found, [Q0], start=10.0, end=40.0) == [Gap(Q0, 30.0, 40.0)]
    assert gaps(found, [Q0], start=10.0, end=30.0) == [Gap(Q0, 10.0, 15.0)]
    assert gaps([], [Q1], start=10.0, end=40.0) == [Gap(Q1, 10.0, 40.0)]


def test_the_bound_and_the_one_step_latency() -> None:
    assert gap_bound(lease=4, margin=2, step=0.5) == 7.0
    found = [
        Interval("p0", 1.0, Q0, 10.4, 12.0, generation=3),
        Interval("p1", 1.0, Q1, 20.1, 22.0, generation=4),
        Interval("p1", 1.0, Q0, 99.0, 99.5, generation=5),  # generation 5 is not measured
        Interval("p2", 1.0, Q0, 9.0, 10.0, generation=3),  # begun before: not caused by it
    ]
    assert step_latency(found, {3: 10.0, 4: 20.0}) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="no app began"):
        step_latency(found, {9: 1.0})


def test_the_score_splits_the_gap_at_the_revocation_and_the_table_shows_it() -> None:
    found = [Interval("p0", 1.0, Q0, 0.0, 12.0), Interval("p1", 1.0, Q0, 40.0, 50.0)]
    (longest,) = gaps(found, [Q0], start=10.0, end=50.0)
    score = FaultScore(
        "partition-api", 0.3, 10.0, 2, [], longest, 20.0, held=25.0, step=0.5, lease=4, margin=2
    )
    assert score.bound == 7.0
    assert score.after_detection == pytest.approx(10.0)  # revoked at 30, processed again at 40
    text = table([score])
    assert "partition-api" in text
    assert "28.0 (orders/broker-a:0)" in text
    undetected = FaultScore(
        "api-restart", 0.1, 10.0, 2, [], longest, None, held=9.0, step=0.5, lease=4, margin=2
    )
    assert undetected.after_detection == pytest.approx(28.0)


# -- messages ----------------------------------------------------------------------------------


def _sent(*items: tuple[str, int, str, int, float]) -> list[Sent]:
    return [Sent(q, o, k, s, at) for q, o, k, s, at in items]


def _done(member: str, boot: float, *items: tuple[str, int, str, int, float]) -> list[Processed]:
    return [Processed(member, boot, q, o, k, s, at) for q, o, k, s, at in items]


SENT = _sent((Q0, 0, "k0", 0, 1.0), (Q0, 1, "k0", 1, 1.1), (Q0, 2, "k0", 2, 1.2), (Q1, 0, "k1", 0, 1.0))


def test_every_message_processed_once_in_order_scores_clean() -> None:
    done = _done("p0", 1.0, (Q0, 0, "k0", 0, 2.0), (Q0, 1, "k0", 1, 2.1), (Q0, 2, "k0", 2, 2.2))
    done += _done("p1", 1.0, (Q1, 0, "k1", 0, 2.0))
    score = message_score(SENT, done)
    assert (score.sent, score.processed, score.lost, score.duplicates, score.order_violations) == (
        4,
        4,
        [],
        [],
        [],
    )
    assert score.by_cause() == {"same run": 0, "after restart": 0, "two pods": 0}
    assert score.longest_wait == pytest.approx(1.0)


def test_a_planted_loss_is_caught() -> None:
    done = _done("p0", 1.0, (Q0, 0, "k0", 0, 2.0), (Q0, 2, "k0", 2, 2.2), (Q1, 0, "k1", 0, 2.0))
    score = message_score(SENT, done)
    assert score.lost == [SENT[1]]  # offset 1 of Q0 never processed
    # An order violation needs a first processing below what was seen: skipping one is a loss only.
    assert score.order_violations == []


def test_planted_duplicates_are_caught_by_cause() -> None:
    done = _done("p0", 1.0, (Q0, 0, "k0", 0, 2.0), (Q0, 1, "k0", 1, 2.1), (Q1, 0, "k1", 0, 2.0))
    done += _done("p0", 5.0, (Q0, 1, "k0", 1, 6.0), (Q0, 2, "k0", 2, 6.1))  # the same pod's next run
    done += _done("p1", 1.0, (Q1, 0, "k1", 0, 7.0))  # another pod
    done += _done("p0", 5.0, (Q0, 2, "k0", 2, 8.0))  # the same run again
    score = message_score(SENT, done)
    assert score.lost == []
    assert score.by_cause() == {"same run": 1, "after restart": 1, "two pods": 1}
    two_pods = next(d for d in score.duplicates if d.cause == "two pods")
    assert (two_pods.first.member, two_pods.again.member, two_pods.again.queue) == ("p0", "p1", Q1)
    assert score.order_violations == []  # a redelivery replays in order: a duplicate, not a violation


def test_a_planted_order_violation_is_caught() -> None:
    # Two pods on one queue: p1 processes seq 2 before p0 gets to seq 1 (first time for each).
    done = _done("p0", 1.0, (Q0, 0, "k0", 0, 2.0), (Q0, 1, "k0", 1, 2.5), (Q1, 0, "k1", 0, 2.0))
    done += _done("p1", 1.0, (Q0, 2, "k0", 2, 2.2))
    score = message_score(SENT, done)
    assert score.lost == []
    assert score.duplicates == []
    (violation,) = score.order_violations
    assert (violation.ahead.seq, violation.late.seq, violation.late.member) == (2, 1, "p0")


def test_a_window_counts_losses_by_sending_and_duplicates_by_the_second_processing() -> None:
    done = _done("p0", 1.0, (Q0, 0, "k0", 0, 2.0), (Q0, 2, "k0", 2, 2.2), (Q1, 0, "k1", 0, 2.0))
    done += _done("p1", 1.0, (Q0, 0, "k0", 0, 9.0))
    early = message_score(SENT, done, None, 1.05)
    late = message_score(SENT, done, 1.05, None)
    assert (early.sent, early.lost, early.duplicates) == (2, [], [])
    assert late.lost == [SENT[1]]
    assert len(late.duplicates) == 1


def test_only_a_killed_runs_in_flight_messages_may_come_again() -> None:
    done = _done("p0", 1.0, (Q0, 0, "k0", 0, 2.0), (Q0, 1, "k0", 1, 2.1), (Q0, 2, "k0", 2, 2.2))
    done += _done("p0", 5.0, (Q0, 1, "k0", 1, 6.0), (Q0, 2, "k0", 2, 6.1))
    score = message_score(SENT, done)
    in_flight = {("p0", 1.0): {(Q0, 2)}}  # the killed run's last batch was offset 2 only
    (unexplained,) = only_in_flight(score.duplicates, in_flight)
    assert unexplained.first.offset == 1
    assert only_in_flight(score.duplicates, {("p0", 1.0): {(Q0, 1), (Q0, 2)}}) == []


def test_a_cut_off_run_in_flight_is_its_last_batch_before_the_heal() -> None:
    batches = [
        Batch("p0", 1.0, Q0, 2.0, frozenset({0, 1})),
        Batch("p0", 1.0, Q1, 2.1, frozenset({0})),
        Batch("p0", 1.0, Q0, 3.0, frozenset({2, 3})),  # processed as the cut came, not committed
        Batch("p0", 1.0, Q0, 9.0, frozenset({7})),  # after the heal: Q0 given back to the same run
        Batch("p1", 4.0, Q0, 5.0, frozenset({2, 3, 4})),
    ]
    assert in_flight(batches, [CutRun("p0", 1.0, until=8.0)]) == {("p0", 1.0): {(Q0, 2), (Q0, 3), (Q1, 0)}}
    # A run that ended: its last batch of each queue, whenever it came; runs not cut count nothing.
    assert in_flight(batches, [CutRun("p0", 1.0)]) == {("p0", 1.0): {(Q0, 7), (Q1, 0)}}
    assert in_flight(batches, [CutRun("p2", 1.0)]) == {}
    # The defect the bound exists for: p1 redid what p0 had in flight; counting p0's batch after the
    # heal as its last would leave that duplicate unexplained.
    done = _done("p0", 1.0, (Q0, 2, "k0", 2, 2.9), (Q0, 3, "k0", 3, 2.95))
    done += _done("p1", 4.0, (Q0, 2, "k0", 2, 5.0), (Q0, 3, "k0", 3, 5.1))
    duplicates = message_score([], done).duplicates
    assert len(duplicates) == 2
    assert only_in_flight(duplicates, in_flight(batches, [CutRun("p0", 1.0, until=8.0)])) == []
    assert len(only_in_flight(duplicates, in_flight(batches, [CutRun("p0", 1.0)]))) == 2


def test_the_table_shows_the_message_columns() -> None:
    score = FaultScore("consumer SIGKILL", 0.5, 10.0, 4, [], Gap(Q0, 10.0, 11.0), None, 1.0, 0.1, 4.0, 2.0)
    done = _done("p0", 1.0, (Q0, 0, "k0", 0, 2.0), (Q0, 0, "k0", 0, 3.0))
    with_messages = replace(score, group="g (Release)", messages=message_score(SENT[:1], done))
    text = table([with_messages])
    assert "duplicates same run/after restart/two pods" in text.splitlines()[0]
    assert "1/0/0" in text.splitlines()[1]
