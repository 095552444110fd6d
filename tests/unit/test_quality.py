"""Quality figures of an assignment change."""

from __future__ import annotations

from mqbalance.model import MessageModel, MessageQueue, Zones
from mqbalance.quality import Figures, measure, minimum_moves

Q = [MessageQueue("t", "a", i) for i in range(6)]


def test_moves_forced_and_the_minimum() -> None:
    previous = {"c1": (Q[0], Q[1], Q[2]), "gone": (Q[3], Q[4])}
    current = {"c1": (Q[0], Q[3], Q[5]), "c2": (Q[1], Q[2], Q[4])}
    figures = measure(previous, current)
    # Q1 and Q2 left c1 without need; Q3 and Q4 had to move; Q5 is new.
    assert figures == Figures(
        members=2,
        queues=6,
        moved=4,
        forced=2,
        minimum_moves=2,
        spread=0,
        min_load=3,
        max_load=3,
        topic_spread=0,
        cross_zone=0,
        unassigned=0,
    )
    assert minimum_moves(previous, Q, ["c2", "c1"]) == 2


def test_extra_slot_goes_to_whoever_held_most() -> None:
    # 5 queues over 2 members: the member that held 3 keeps all 3.
    previous = {"c1": tuple(Q[:3]), "c2": tuple(Q[3:5])}
    assert minimum_moves(previous, Q[:5], ["c1", "c2"]) == 0
    assert minimum_moves(previous, Q[:5], ["c1", "c2", "c3"]) == 1


def test_cross_zone_and_unassigned() -> None:
    zones = Zones({"a": "z1"}, {"c1": "z1", "c2": "z2"})
    figures = measure(None, {"c1": (Q[0],), "c2": (Q[1], Q[2])}, zones=zones, queues=Q)
    assert figures.cross_zone == 2
    assert figures.unassigned == 3
    assert figures.spread == 1
    assert figures.moved == figures.minimum_moves == 0


def test_broadcasting_reports_no_movement() -> None:
    everything = tuple(Q)
    figures = measure(
        {"c1": everything}, {"c1": everything, "c2": everything}, message_model=MessageModel.BROADCASTING
    )
    assert (figures.moved, figures.forced, figures.minimum_moves) == (0, 0, 0)
    assert figures.max_load == figures.min_load == 6


def test_empty_group_and_json_keys() -> None:
    figures = measure({"c1": (Q[0],)}, {})
    assert figures.members == 0
    assert figures.to_json()["minimumMoves"] == 0
    assert set(figures.to_json()) == {
        "members",
        "queues",
        "moved",
        "forced",
        "minimumMoves",
        "spread",
        "minLoad",
        "maxLoad",
        "topicSpread",
        "crossZone",
        "unassigned",
    }


def test_spread_counts_every_topic_together_and_topic_spread_each_alone() -> None:
    # RocketMQ's AVG per topic: 3 topics of 5 queues over 2 members, every extra queue to c1.
    topics = {t: [MessageQueue(t, "b", i) for i in range(5)] for t in ("t1", "t2", "t3")}
    current = {
        "c1": tuple(q for qs in topics.values() for q in qs[:3]),
        "c2": tuple(q for qs in topics.values() for q in qs[3:]),
    }
    figures = measure(None, current)
    assert (figures.min_load, figures.max_load, figures.spread, figures.topic_spread) == (6, 9, 3, 1)
    # One topic held by one member alone: that topic's spread counts the member holding none.
    lopsided = measure(None, {"c1": tuple(topics["t1"]), "c2": tuple(topics["t2"])})
    assert (lopsided.spread, lopsided.topic_spread) == (0, 5)


def test_minimum_moves_keeps_every_topic_and_the_total_balanced() -> None:
    # c1 held both queues of t1, c2 both of t2: balanced in total, but not within a topic.
    # Each topic must end 1 and 1, so two queues move (counted over all topics, none would).
    t1 = [MessageQueue("t1", "b", i) for i in range(2)]
    t2 = [MessageQueue("t2", "b", i) for i in range(2)]
    previous = {"c1": tuple(t1), "c2": tuple(t2)}
    assert minimum_moves(previous, t1 + t2, ["c1", "c2"]) == 2
