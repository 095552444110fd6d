"""The single-process replay: every state through every strategy, each fed its own past."""

from __future__ import annotations

from collections import Counter

import pytest

from mqbalance.model import MessageModel, MessageQueue, StrategyName, StrategySpec, Zones
from mqbalance.pipeline import sample_journal, synthetic
from mqbalance.pipeline.events import Event, event_from_record
from mqbalance.pipeline.replay import CANDIDATE_LABELS, ReplayError, replay, replay_group, strategy_label
from mqbalance.quality import measure
from mqbalance.strategies import allocate_group

CHURN = synthetic.Churn(groups=4, events_per_group=25, zones=3, queues=(2, 5), topics=2, seed=5)


def test_every_event_is_replayed_through_every_candidate_once() -> None:
    rows = list(replay(synthetic.events(CHURN)))
    per_event = Counter((r.group, r.seq) for r in rows)
    assert set(per_event.values()) == {len(CANDIDATE_LABELS)}
    assert len(per_event) == CHURN.total_events
    assert {r.strategy for r in rows} == set(CANDIDATE_LABELS)
    # Synthetic groups run RocketMQ's default strategy.
    assert {r.strategy for r in rows if r.current} == {"AVG"}


def test_each_strategy_is_fed_its_own_previous_assignment() -> None:
    spec = StrategySpec(StrategyName.STICKY, zone_affinity=True)
    events = list(synthetic.group_events(CHURN, 1))
    expected = []
    previous: dict[str, tuple[MessageQueue, ...]] = {}
    for event in events:
        zones = Zones(brokers=event.broker_zones, consumers=event.members)
        topics = {topic: event.queues_of(topic) for topic in event.topics}
        now = allocate_group(spec, topics, event.members, zones=zones, previous=previous)
        current = {m: tuple(mq for a in now.values() for mq in a[m]) for m in event.members}
        queues = [mq for qs in topics.values() for mq in qs]
        expected.append(measure(previous or None, current, zones=zones, queues=queues).moved)
        previous = current
    rows = [r for r in replay_group(reversed(events)) if r.strategy == "STICKY+zoneAffinity"]
    assert [r.seq for r in rows] == list(range(len(events)))
    assert [r.moved for r in rows] == expected


def test_sticky_moves_the_minimum_and_avg_moves_more() -> None:
    rows = list(replay(synthetic.events(CHURN)))
    sticky = [r for r in rows if r.strategy == "STICKY"]
    assert all(r.moved == r.minimum_moves for r in sticky)
    assert all(r.spread <= 1 and r.unassigned == 0 for r in sticky)
    avg_moved = sum(r.moved for r in rows if r.strategy == "AVG")
    assert avg_moved > sum(r.moved for r in sticky)


def test_figures_sum_over_topics() -> None:
    event = next(synthetic.group_events(CHURN, 0))
    for row in replay_group([event]):
        assert row.queues == sum(len(ids) for by in event.queues.values() for ids in by.values())
        assert row.members == len(event.members)
        assert row.held + row.unassigned == row.queues


def test_the_replay_of_a_journal_agrees_with_what_the_operator_logged() -> None:
    churn = synthetic.Churn(groups=8, events_per_group=6, seed=7)
    records = list(sample_journal.records(churn))
    rows = list(replay(event_from_record(r) for r in records))
    current = {(r.group, r.seq): r for r in rows if r.current}
    assert len(current) == len(records)
    for rec in records:
        row = current[(rec.group, rec.generation)]
        assert row.strategy == strategy_label(rec.strategy)
        assert row.moved == rec.moved
        held = sum(len(q) for a in rec.assignment.values() for q in a.values())
        assert row.held == held


def test_group_specific_strategies_are_replayed_beside_the_candidates() -> None:
    churn = synthetic.Churn(groups=8, events_per_group=4, seed=7)
    events = [event_from_record(r) for r in sample_journal.records(churn)]
    labels = {r.strategy for r in replay(events)}
    assert set(CANDIDATE_LABELS) < labels
    assert {"CONFIG", "MACHINE_ROOM(zone-0,zone-1)", "CONSISTENT_HASH(virtualNodes=5)"} <= labels
    assert "MACHINE_ROOM_NEARBY(CONSISTENT_HASH,virtualNodes=10)" not in labels


def test_broadcasting_moves_nothing_and_everyone_holds_everything() -> None:
    event = Event(
        "ns",
        "g",
        seq=0,
        time=0.0,
        members={"a": "z1", "b": "z2"},
        broker_zones={"broker": "z1"},
        queues={"t": {"broker": [0, 1, 2]}},
        message_model=MessageModel.BROADCASTING.value,
    )
    later = Event(**{**event.__dict__, "seq": 1, "time": 1.0, "members": {"b": "z2", "c": "z1"}})
    for row in replay_group([event, later]):
        assert (row.moved, row.minimum_moves, row.held, row.cross_zone) == (0, 0, 6, 3)


def test_strategy_labels_show_non_default_parameters() -> None:
    assert strategy_label(StrategySpec(StrategyName.CONSISTENT_HASH)) == "CONSISTENT_HASH"
    assert strategy_label(StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=3)) == (
        "CONSISTENT_HASH(virtualNodes=3)"
    )
    nearby = StrategySpec(StrategyName.MACHINE_ROOM_NEARBY, inner=StrategyName.AVG_BY_CIRCLE)
    assert strategy_label(nearby) == "MACHINE_ROOM_NEARBY(AVG_BY_CIRCLE)"
    assert strategy_label(StrategySpec(StrategyName.STICKY, zone_affinity=True)) == "STICKY+zoneAffinity"


def test_a_state_that_cannot_be_allocated_names_the_group_and_event() -> None:
    event = Event("shop", "orders", seq=4, time=0.0, members={"a": ""}, queues={"t": {"b": [0]}})
    with pytest.raises(ReplayError, match=r"shop/orders event 4, MACHINE_ROOM_NEARBY"):
        list(replay_group([event]))
