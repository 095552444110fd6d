"""Round robin, last-broker avoidance and fault-aware selection, as RocketMQ's clients do them."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.model import PERM_READ, PERM_READ_WRITE, PERM_WRITE, Broker, MessageQueue, TopicRoute
from mqbalance.producer import (
    LATENCY_4X,
    Generation,
    MovingIndex,
    NoWritableQueueError,
    QueueSelector,
    writable_queues,
)

INT_MAX = 2**31 - 1


class FakeClock:
    """Integer milliseconds that move only when a test says so."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def route(*brokers: tuple[str, int]) -> TopicRoute:
    return TopicRoute("T", tuple(Broker(name, n, n) for name, n in brokers))


AB = route(("broker-b", 4), ("broker-a", 4))  # listed out of order on purpose
C = route(("a", 2), ("b", 2), ("c", 2))


def names(queues: list[MessageQueue]) -> list[str]:
    return [f"{q.broker_name}:{q.queue_id}" for q in queues]


@pytest.mark.parametrize("generation", ["4.x", "5.x"])
def test_round_robin_walks_the_sorted_writable_queues_from_the_start(generation: str) -> None:
    selector = QueueSelector(generation=generation, index_start=5)
    picks = [selector.select_queue(AB) for _ in range(16)]
    queues = AB.writable_queues()
    assert picks == [queues[(5 + 1 + i) % 8] for i in range(16)]
    assert names(picks[:3]) == ["broker-b:2", "broker-b:3", "broker-a:0"]
    assert set(Counter(picks).values()) == {2}


@settings(max_examples=50)
@given(
    start=st.integers(0, INT_MAX),
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    rounds=st.integers(1, 3),
)
def test_round_robin_is_even_over_whole_rounds(start: int, sizes: list[int], rounds: int) -> None:
    topic = route(*((f"b{i}", n) for i, n in enumerate(sizes)))
    selector = QueueSelector(index_start=start)
    n = sum(sizes)
    picks = [selector.select_queue(topic) for _ in range(n * rounds)]
    if start + n * rounds <= INT_MAX:  # no wrap inside the run
        assert Counter(picks) == Counter({q: rounds for q in topic.writable_queues()})


def test_moving_index_wraps_like_a_java_int() -> None:
    index = MovingIndex(INT_MAX - 1)
    assert index.increment_and_get() == INT_MAX
    assert index.increment_and_get() == 0  # MIN_VALUE & 0x7FFFFFFF
    assert index.value == -(2**31)
    assert index.increment_and_get() == 1
    with pytest.raises(ValueError, match="Java int"):
        MovingIndex(2**31)


def test_index_starts_come_from_the_injected_random() -> None:
    first = QueueSelector(rng=random.Random(7))
    second = QueueSelector(rng=random.Random(7))
    assert [first.select_queue(C) for _ in range(5)] == [second.select_queue(C) for _ in range(5)]


def test_each_topic_has_its_own_index() -> None:
    other = TopicRoute("U", C.brokers)
    selector = QueueSelector(index_start=0)
    assert selector.select_queue(C).queue_id == 1
    assert selector.select_queue(other) == MessageQueue("U", "a", 1)
    assert selector.select_queue(C) == MessageQueue("T", "b", 0)


@pytest.mark.parametrize("generation", ["4.x", "5.x"])
def test_a_retry_skips_the_last_broker_probing_in_turn(generation: str) -> None:
    selector = QueueSelector(generation=generation, index_start=0)
    first = selector.select_queue(AB)  # index 1: broker-a:1
    assert names([first]) == ["broker-a:1"]
    retry = selector.select_queue(AB, last_broker="broker-a")  # probes 2, 3 (broker-a), takes 4
    assert names([retry]) == ["broker-b:0"]
    assert names([selector.select_queue(AB)]) == ["broker-b:1"]  # every probe moved the index


@settings(max_examples=60)
@given(
    start=st.integers(0, INT_MAX),
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    last=st.integers(0, 3),
    generation=st.sampled_from(["4.x", "5.x"]),
)
def test_a_retry_never_returns_to_the_last_broker_when_another_exists(
    start: int, sizes: list[int], last: int, generation: str
) -> None:
    topic = route(*((f"b{i}", n) for i, n in enumerate(sizes)))
    last_broker = f"b{last % len(sizes)}"
    selector = QueueSelector(generation=generation, index_start=start)
    assert selector.select_queue(topic, last_broker=last_broker).broker_name != last_broker


@pytest.mark.parametrize("generation", ["4.x", "5.x"])
def test_a_single_broker_topic_retries_on_the_same_broker(generation: str) -> None:
    topic = route(("only", 3))
    selector = QueueSelector(generation=generation, index_start=0)
    # Probes 1, 2, 3 all hit "only"; the fallback takes index 4.
    assert selector.select_queue(topic, last_broker="only") == MessageQueue("T", "only", 1)
    assert selector.select_queue(topic) == MessageQueue("T", "only", 2)


def test_without_fault_tolerance_isolation_is_ignored() -> None:
    selector = QueueSelector(index_start=0, clock=FakeClock())
    selector.report("a", 0, failed=True, reachable=False)
    assert selector.select_queue(C).broker_name == "a"  # index 1 -> a:1
    assert selector.select_queue(C, fault_tolerance=True).broker_name != "a"


def isolate(selector: QueueSelector, broker: str, *, reachable: bool) -> None:
    selector.report(broker, 0, failed=True, reachable=reachable)


def test_5x_prefers_available_then_reachable_then_any() -> None:
    selector = QueueSelector(fault_tolerance=True, clock=FakeClock(), index_start=0)
    isolate(selector, "a", reachable=True)
    isolate(selector, "b", reachable=False)
    assert {selector.select_queue(C).broker_name for _ in range(12)} == {"c"}
    isolate(selector, "c", reachable=False)
    assert {selector.select_queue(C).broker_name for _ in range(12)} == {"a"}
    isolate(selector, "a", reachable=False)
    anyone = [selector.select_queue(C) for _ in range(6)]
    assert set(anyone) == set(C.writable_queues())  # plain round robin over every queue


def test_5x_isolation_ends_on_the_clock() -> None:
    clock = FakeClock(0)
    selector = QueueSelector(fault_tolerance=True, clock=clock, index_start=0)
    isolate(selector, "a", reachable=True)
    clock.now = 9_999
    assert "a" not in {selector.select_queue(C).broker_name for _ in range(12)}
    clock.now = 10_000
    assert "a" in {selector.select_queue(C).broker_name for _ in range(12)}


def test_5x_retry_avoids_the_last_broker_in_every_tier() -> None:
    selector = QueueSelector(fault_tolerance=True, clock=FakeClock(), rng=random.Random(1))
    for _ in range(20):
        assert selector.select_queue(C, last_broker="a").broker_name != "a"
    isolate(selector, "b", reachable=True)
    for _ in range(20):  # c is the only available non-last broker
        assert selector.select_queue(C, last_broker="a").broker_name == "c"
    isolate(selector, "c", reachable=False)
    for _ in range(20):  # b is the only reachable non-last broker
        assert selector.select_queue(C, last_broker="a").broker_name == "b"


def test_5x_retry_resets_the_index_from_the_injected_random() -> None:
    runs = []
    for _ in range(2):
        selector = QueueSelector(fault_tolerance=True, clock=FakeClock(), rng=random.Random(3), index_start=0)
        runs.append([selector.select_queue(C, last_broker="a") for _ in range(10)])
    assert runs[0] == runs[1]
    plain = QueueSelector(fault_tolerance=True, clock=FakeClock(), rng=random.Random(3), index_start=0)
    plain.select_queue(C, last_broker="a")
    assert plain.index("T").value != 2  # jumped, not stepped from 0


def test_4x_takes_the_first_available_queue_in_turn_ignoring_the_last_broker() -> None:
    selector = QueueSelector(generation="4.x", fault_tolerance=True, clock=FakeClock(), index_start=0)
    isolate(selector, "a", reachable=True)
    # index 1 -> a:1 unavailable, walk on locally to b:0; the shared index stays at 1.
    assert selector.select_queue(C) == MessageQueue("T", "b", 0)
    assert selector.index("T").value == 1
    # 4.x's fault path does not look at the last broker.
    assert selector.select_queue(C, last_broker="b") == MessageQueue("T", "b", 0)


def test_4x_walk_wraps_like_javas_local_int() -> None:
    selector = QueueSelector(
        generation="4.x", fault_tolerance=True, clock=FakeClock(), index_start=INT_MAX - 1
    )
    for broker in ("a", "b"):
        isolate(selector, broker, reachable=True)
    # index -> MAX_VALUE: pos 1 (a:1). The walk wraps to MIN_VALUE, whose Math.abs stays
    # negative, so Java's `if (pos < 0) pos = 0` gives a:0; after that Math.abs runs the
    # positions backwards: MIN+1 -> 1 (a:1), MIN+2 -> 0 (a:0), MIN+3 -> 5 (c:1).
    assert selector.select_queue(C) == MessageQueue("T", "c", 1)


def test_4x_with_nothing_available_sends_to_pick_one_at_least() -> None:
    clock = FakeClock()
    selector = QueueSelector(generation="4.x", fault_tolerance=True, clock=clock, index_start=0)
    selector.report("a", 2500)  # 120 s
    selector.report("b", 3500)  # 180 s
    selector.report("c", 16000)  # 600 s
    # None available: rank by latency a, b, c; half = 1, so always a.
    picks = [selector.select_queue(C) for _ in range(4)]
    assert {q.broker_name for q in picks} == {"a"}
    assert {q.queue_id for q in picks} <= {0, 1}
    assert selector.faults.table is LATENCY_4X


def test_4x_drops_a_picked_broker_the_route_no_longer_holds() -> None:
    selector = QueueSelector(generation="4.x", fault_tolerance=True, clock=FakeClock(), index_start=0)
    only_a = route(("a", 2))
    selector.report("a", 50, failed=True)
    selector.report("gone", 0, failed=True)
    # Both unavailable; by latency "gone" ranks first, and the route has no such broker:
    # Java removes it and falls back to plain round robin.
    assert selector.select_queue(only_a).broker_name == "a"
    assert selector.faults.item("gone") is None


@pytest.mark.parametrize(
    "topic",
    [
        TopicRoute("T", ()),
        TopicRoute("T", (Broker("a", 4, 0),)),
        TopicRoute("T", (Broker("a", 4, 4, perm=PERM_READ),)),
    ],
    ids=["no-brokers", "no-write-queues", "read-only"],
)
def test_a_route_without_writable_queues_is_a_clear_error(topic: TopicRoute) -> None:
    with pytest.raises(NoWritableQueueError, match="topic 'T' has no writable queue"):
        QueueSelector().select_queue(topic)
    with pytest.raises(ValueError, match="writeQueueNums > 0"):
        QueueSelector().select_by_key(topic, "hash", "k")


def test_write_only_brokers_count_and_read_only_ones_do_not() -> None:
    topic = TopicRoute("T", (Broker("r", 4, 4, perm=PERM_READ), Broker("w", 0, 2, perm=PERM_WRITE)))
    selector = QueueSelector(index_start=0)
    assert {selector.select_queue(topic) for _ in range(4)} == {
        MessageQueue("T", "w", 0),
        MessageQueue("T", "w", 1),
    }
    assert Broker("x", 1, 1).perm == PERM_READ_WRITE


def test_unknown_generation_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=re.escape("unknown generation '3.x'; use one of 4.x, 5.x")):
        QueueSelector(generation="3.x")
    assert Generation.parse("4.x") is Generation.V4


def test_state_snapshot_names_generation_and_table() -> None:
    selector = QueueSelector(generation="4.x", fault_tolerance=True, clock=FakeClock(5_000))
    selector.report("a", 700)
    state = selector.to_json()
    assert state["generation"] == "4.x"
    assert state["faultTolerance"] is True
    assert state["table"]["failureLatencyMs"] == 30000
    assert state["brokers"][0]["isolatedUntilMs"] == 35_000


def test_docs_worked_example() -> None:
    """The table in docs/producer.md, step by step."""
    clock = FakeClock(0)
    orders = TopicRoute("orders", (Broker("broker-a", 4, 4), Broker("broker-b", 4, 4)))
    selector = QueueSelector(generation="5.x", fault_tolerance=True, clock=clock, index_start=0)

    def take(count: int) -> list[str]:
        return [
            f"{q.broker_name[-1]}:{q.queue_id}" for q in (selector.select_queue(orders) for _ in range(count))
        ]

    assert take(1) == ["a:1"]
    assert selector.report("broker-a", 620).isolated_until_ms == 2_000
    assert take(3) == ["b:0", "b:1", "b:2"]
    clock.now = 1_000
    item = selector.report("broker-b", 3, failed=True, reachable=False)
    assert (item.isolated_until_ms, item.reachable) == (11_000, False)
    assert take(2) == ["a:0", "a:1"]
    clock.now = 2_000
    assert take(4) == ["a:2", "a:3", "a:0", "a:1"]
    clock.now = 11_000
    assert take(4) == ["a:2", "a:3", "b:0", "b:1"]
    assert LATENCY_4X.not_available_duration(620) == 30000
    assert LATENCY_4X.not_available_duration(LATENCY_4X.failure_latency_ms) == 600000


@settings(max_examples=60, deadline=None)
@given(
    generation=st.sampled_from(["4.x", "5.x"]),
    faults=st.booleans(),
    seed=st.integers(0, 1000),
    steps=st.lists(
        st.tuples(st.sampled_from([None, "a", "b", "c"]), st.integers(0, 20_000), st.booleans()),
        min_size=1,
        max_size=30,
    ),
)
def test_passing_the_writable_queues_changes_nothing(
    generation: str, faults: bool, seed: int, steps: list[tuple[str | None, int, bool]]
) -> None:
    # The sidecar hands its precomputed writable queues in; the picks must be exactly the ones
    # the selector makes when it computes them itself.
    def make() -> QueueSelector:
        return QueueSelector(
            generation=generation,
            fault_tolerance=faults,
            clock=FakeClock(),
            rng=random.Random(seed),
            index_start=seed,
        )

    given_queues, computing = make(), make()
    queues = writable_queues(C)
    for last, latency, failed in steps:
        for selector, kwargs in ((given_queues, {"queues": queues}), (computing, {})):
            picked = selector.select_queue(C, last_broker=last, **kwargs)  # type: ignore[arg-type]
            selector.report(picked.broker_name, latency, failed=failed)
        assert given_queues.select_by_key(C, "hash", str(latency), queues=queues) == computing.select_by_key(
            C, "hash", str(latency)
        )
        assert given_queues.to_json() == computing.to_json()


def test_5x_async_retry_keeps_the_index_where_it_is() -> None:
    # MQClientAPIImpl's async retry selects with resetIndex=false: no jump, the walk goes on.
    selector = QueueSelector(fault_tolerance=True, clock=FakeClock(), rng=random.Random(3), index_start=0)
    assert selector.select_queue(C, last_broker="a", reset_index=False) == MessageQueue("T", "b", 0)
    assert selector.index("T").value == 2  # probes a:1 (skipped), b:0
    jumped = QueueSelector(fault_tolerance=True, clock=FakeClock(), rng=random.Random(3), index_start=0)
    jumped.select_queue(C, last_broker="a", reset_index=True)
    assert jumped.index("T").value != 2
