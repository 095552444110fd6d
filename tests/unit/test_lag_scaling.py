"""Scaling by lag: the recommended member count (the rule, its clamps, no data), the per-member
consume rate it divides by, and both in status.lag and the metrics through the lag loop."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from mqbalance.lag import (
    BACKLOG_SECONDS,
    QueueOffsets,
    Sample,
    member_capacity,
    recommended_members,
)
from mqbalance.model import Assignment, MessageQueue
from mqbalance.operator.lagpoll import LagPoller, LagSettings
from mqbalance.operator.main import parse_args
from mqbalance.operator.metrics import LagFigures, OperatorMetrics
from mqbalance.operator.offsets import BrokerFailure, GroupOffsets
from tests.unit.test_lag import FakeReader, lag_patches
from tests.unit.test_operator_loop import NS, Harness, group, pod, start


def mq(q: int) -> MessageQueue:
    return MessageQueue("t", "broker-a", q)


def rule(
    queues: int = 8,
    members: int = 2,
    lag: int = 0,
    produce: float = 0.0,
    capacity: float | None = 100.0,
    drain: float = 300.0,
) -> int:
    return recommended_members(
        queues=queues, members=members, lag=lag, produce_rate=produce, capacity=capacity, drain_seconds=drain
    )


def test_enough_members_to_keep_up_and_to_drain_the_backlog_in_time() -> None:
    assert rule(produce=250) == 3  # 2.5 members' worth arrives
    assert rule(produce=200) == 2  # exactly two: float noise does not make it three
    assert rule(produce=200.0000000001) == 2
    # 60,000 waiting at 100 a second a member: 2 more members drain it in 300 s.
    assert rule(produce=200, lag=60_000) == 4
    assert rule(produce=200, lag=60_000, drain=600) == 3
    assert rule(produce=0, lag=30_000) == 1


def test_clamped_to_one_and_to_the_readable_queues() -> None:
    assert rule(produce=0, lag=0) == 1  # drained and idle: one member, never 0
    assert rule(produce=5_000, queues=8) == 8  # a ninth member would hold no queue
    assert rule(produce=5_000, queues=0) == 1


def test_without_a_measured_member_rate_it_holds_unless_nothing_arrives_or_waits() -> None:
    assert rule(capacity=None, members=3, produce=500, lag=10) == 3
    assert rule(capacity=None, members=3, produce=0, lag=0) == 1
    assert rule(capacity=None, members=12, produce=500, queues=8) == 8
    assert rule(capacity=None, members=0, produce=500) == 1
    assert rule(capacity=0.0, members=3, produce=500) == 3


def test_member_rate_comes_from_the_members_with_a_backlog_only() -> None:
    topics: dict[str, Assignment] = {"t": {"a": (mq(0),), "b": (mq(1),), "c": (mq(2),)}}
    before = Sample(
        0.0, {mq(0): QueueOffsets(5_000, 0), mq(1): QueueOffsets(100, 95), mq(2): QueueOffsets(0, 0)}
    )
    # a: 1,000 consumed in 10 s with thousands waiting: saturated at 100/s. b kept up (5 waiting),
    # c had nothing: neither says what a member can do.
    after = Sample(
        10.0, {mq(0): QueueOffsets(9_000, 1_000), mq(1): QueueOffsets(400, 398), mq(2): QueueOffsets(0, 0)}
    )
    assert member_capacity(before, after, topics) == pytest.approx(100.0)
    assert member_capacity(None, after, topics) is None
    assert member_capacity(after, after, topics) is None
    # A backlog below BACKLOG_SECONDS of the member's own rate (offsets committed every 5 s) is no backlog.
    small = int(30 * BACKLOG_SECONDS) - 1
    keeps_up = Sample(20.0, {mq(0): QueueOffsets(9_300 + small, 1_300)})
    assert (
        member_capacity(Sample(10.0, {mq(0): QueueOffsets(9_000, 9_000 - small)}), keeps_up, topics) is None
    )


def test_drain_seconds_flag() -> None:
    assert parse_args(["-A"]).lag_drain_seconds == 300.0
    assert parse_args(["-A", "--lag-drain-seconds", "60"]).lag_drain_seconds == 60.0
    with pytest.raises(SystemExit):
        parse_args(["-A", "--lag-drain-seconds", "0"])


def test_recommended_members_metric() -> None:
    registry = CollectorRegistry()
    figures = LagFigures(10, 1.0, 2.0, (), (), True, recommended_members=3)
    OperatorMetrics(registry, list, lag=lambda: [("shop", "g", figures)])
    labels = {"namespace": "shop", "group": "g"}
    assert registry.get_sample_value("mqbalance_group_recommended_members", labels) == 3.0


@pytest.mark.asyncio
async def test_lag_loop_recommends_members_from_the_measured_rates() -> None:
    async with Harness() as h:
        await start(h, group(), [pod("p1"), pod("p2")])
        state = h.world.groups[(NS, "g")]
        reader = FakeReader()
        times = iter(range(0, 1000, 10))
        poller = LagPoller(
            h.world,
            reader,
            LagSettings(interval=1, drain_seconds=100),
            h.metrics,
            monotonic=lambda: float(next(times)),
        )
        doc = state.publication.configmap.document  # type: ignore[union-attr]
        assert doc is not None
        queues = sorted(q for qs in doc.topics["t"].values() for q in qs)
        q1 = doc.topics["t"]["p1"][0]

        def offsets(produced: int, consumed: int) -> GroupOffsets:
            # All traffic on q1 (p1's); the other queues hold nothing.
            answer = {q: QueueOffsets(0, 0) for q in queues}
            answer[q1] = QueueOffsets(produced, consumed)
            return GroupOffsets(answer, requests=1)

        reader.answer = offsets(2_000, 0)
        await poller.poll_once()
        await h.settle()
        assert "recommendedMembers" not in lag_patches(h)[-1]["lag"]  # one reading: no rates, no figure

        # p1 consumed 500 in 10 s with a backlog: 50/s a member; 300/s arrive and 4,500 wait:
        # ceil(300/50 + 4,500/(50 x 100)) = ceil(6.9) = 7, clamped to the group's queues.
        reader.answer = offsets(5_000, 500)
        await poller.poll_once()
        await h.settle()
        lag = lag_patches(h)[-1]["lag"]
        assert lag["memberConsumeRate"] == 50.0
        assert lag["recommendedMembers"] == min(7, len(queues))
        assert state.lag_figures is not None
        assert state.lag_figures.recommended_members == lag["recommendedMembers"]

        # Nothing arrives any more and the backlog is gone: one member.
        reader.answer = offsets(5_000, 5_000)
        await poller.poll_once()
        await h.settle()
        assert lag_patches(h)[-1]["lag"]["recommendedMembers"] == 1
        # The status is merge-patched: the rate kept from the last backlog is not written again.
        assert "memberConsumeRate" not in lag_patches(h)[-1]["lag"]
        assert (state.publication.status or {})["lag"]["memberConsumeRate"] == 50.0

        # A broker that cannot be read: no rates, so no recommendation (an autoscaler holds).
        failure = BrokerFailure("BrokerUnreachable", "b", "t", "broker b (127.0.0.1:1): refused")
        reader.answer = GroupOffsets({q1: QueueOffsets(5_000, 5_000)}, (failure,), requests=2)
        await poller.poll_once()
        await h.settle()
        assert "recommendedMembers" not in (state.publication.status or {})["lag"]
