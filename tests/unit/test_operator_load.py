"""STICKY with ``load`` on a ConsumerGroup: the spec's reader, the pure reconcile with measured
rates and the hysteresis state, and the lag loop feeding rates to the group through the work loop."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mqbalance.contract import Ack, SpecError, read_strategy, write_strategy
from mqbalance.lag import QueueOffsets
from mqbalance.model import LoadBalance, MessageQueue
from mqbalance.operator.lagpoll import LagPoller, LagSettings, load_spread, queue_rates
from mqbalance.operator.metrics import LagFigures, OperatorMetrics
from mqbalance.operator.offsets import GroupOffsets
from mqbalance.operator.reconcile import LOAD_IMBALANCE, Observed, Outcome, reconcile
from mqbalance.strategies import LoadState
from tests.unit.test_lag import FakeReader
from tests.unit.test_operator_loop import NS, Harness, group, pod, start
from tests.unit.test_operator_reconcile import T0, cond, observe
from tests.unit.test_operator_reconcile import pod as member

# -- the reader ------------------------------------------------------------------------------------


def test_load_reads_with_defaults_and_round_trips() -> None:
    spec = read_strategy({"name": "STICKY", "load": {}})
    assert spec.load == LoadBalance()
    spec = read_strategy({"name": "STICKY", "load": {"tolerance": 0.5, "samples": 4, "maxQueueFactor": 1}})
    assert spec.load == LoadBalance(tolerance=0.5, samples=4, max_queue_factor=1.0)
    assert write_strategy(spec)["load"] == {"tolerance": 0.5, "samples": 4, "maxQueueFactor": 1.0}
    assert read_strategy(write_strategy(spec)) == spec
    assert read_strategy({"name": "STICKY"}).load is None
    assert "load" not in write_strategy(read_strategy({"name": "STICKY"}))


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ({"name": "AVG", "load": {}}, "spec.strategy.load balances measured traffic and only STICKY"),
        ({"load": {}}, "strategy is AVG: set spec.strategy.name to STICKY or remove spec.strategy.load"),
        ({"name": "STICKY", "load": 3}, "spec.strategy.load must be an object"),
        (
            {"name": "STICKY", "load": {"tolerance": -0.1}},
            "spec.strategy.load.tolerance is -0.1; use a number",
        ),
        ({"name": "STICKY", "load": {"tolerance": "x"}}, "spec.strategy.load.tolerance is 'x'"),
        ({"name": "STICKY", "load": {"tolerance": 11}}, "from 0 to 10"),
        ({"name": "STICKY", "load": {"samples": 0}}, "spec.strategy.load.samples is 0; use a whole number"),
        ({"name": "STICKY", "load": {"samples": 2.5}}, "spec.strategy.load.samples is 2.5"),
        ({"name": "STICKY", "load": {"samples": True}}, "spec.strategy.load.samples is True"),
        ({"name": "STICKY", "load": {"maxQueueFactor": 0.5}}, "spec.strategy.load.maxQueueFactor is 0.5"),
    ],
)
def test_bad_load_settings_say_which_field_to_fix(strategy: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace(".", r"\.").replace("(", r"\(")):
        read_strategy(strategy)


def test_a_group_with_load_on_another_strategy_is_invalid_and_publishes_nothing() -> None:
    obs = observe([member("p1")])
    obs = replace(obs, spec={**obs.spec, "strategy": {"name": "CONSISTENT_HASH", "load": {}}})
    out = reconcile(obs)
    assert out.document is None
    assert out.invalid
    invalid = cond(out, "Invalid")
    assert invalid["reason"] == "InvalidSpec"
    assert "only STICKY takes it" in invalid["message"]


# -- the pure reconcile with rates ------------------------------------------------------------------

TOPIC4 = {"topicName": "T", "brokers": [{"name": "b1", "readQueueNums": 4, "writeQueueNums": 4}]}
Q = [MessageQueue("T", "b1", i) for i in range(4)]
HOT = {Q[0]: 50.0, Q[1]: 10.0, Q[2]: 10.0, Q[3]: 10.0}
"""With two members holding two queues each: 60 and 20 msg/s; limit 55 at tolerance 0.1."""


def load_group(handover: str = "Off", **load: Any) -> Observed:
    obs = observe([member("p1"), member("p2")], topics={"t": TOPIC4})
    strategy = {"name": "STICKY", "load": {"tolerance": 0.1, "samples": 2, **load}}
    spec = {**obs.spec, "strategy": strategy, "handover": {"mode": handover}}
    return replace(obs, spec=spec, alive=frozenset({"p1", "p2"}))


def after(obs: Observed, out: Outcome, **kw: Any) -> Observed:
    """The next observation once ``out`` was written, with the state the operator keeps."""
    state = out.load_state if out.load_state is not None else obs.load_state
    fields = {
        "previous": out.document or obs.previous,
        "status": out.status,
        "load_state": state,
        "load_target": out.load_target,
        **kw,
    }
    return replace(obs, **fields)


def loads_of(out: Outcome, loads: dict[MessageQueue, float]) -> dict[str, float]:
    assert out.load_target is not None
    return {m: sum(loads[q] for q in qs) for m, qs in out.load_target.items()}


def test_without_rates_the_group_is_sticky() -> None:
    first = reconcile(load_group())
    assert first.document is not None
    assert first.document.strategy == "STICKY"
    assert first.document.topics["T"] == {"p1": (Q[0], Q[1]), "p2": (Q[2], Q[3])}
    assert first.load_state is None  # nothing measured: the hysteresis stays as it was
    again = reconcile(after(load_group(), first, now=T0 + 30))
    assert again.document is None


def test_an_imbalance_lasting_samples_readings_moves_the_fewest_queues_then_nothing_moves() -> None:
    obs = load_group()
    first = reconcile(obs)
    one = reconcile(after(obs, first, loads=HOT, now=T0 + 10))
    assert one.document is None  # above the limit for one reading: wait
    assert one.load_state == LoadState(over=1)
    two = reconcile(after(obs, one, previous=first.document, loads=HOT, now=T0 + 20))
    assert two.document is not None
    assert two.document.reason == LOAD_IMBALANCE == two.status["lastRebalance"]["reason"]
    assert two.journal is not None
    assert two.journal.reason == LOAD_IMBALANCE
    assert two.journal.strategy.load == LoadBalance(tolerance=0.1, samples=2)
    assert two.status["lastRebalance"]["moved"] == 1  # the fewest: p1 gives away one cold queue
    assert loads_of(two, HOT) == {"p1": 50.0, "p2": 30.0}  # within (1 + 0.1) x 50
    assert two.load_state == LoadState()
    assert "load-imbalance" in two.notes[-1].message
    # Rates that jitter within the settle margin move nothing, reading after reading.
    obs = after(obs, two)
    for i, factor in enumerate((1.03, 0.97, 1.02, 0.98)):
        jittered = {q: rate * (factor if q == Q[0] else 2 - factor) for q, rate in HOT.items()}
        out = reconcile(replace(obs, loads=jittered, now=T0 + 30 + i))
        assert out.document is None
        obs = after(obs, out)


def test_a_reading_within_the_limit_resets_the_streak() -> None:
    obs = load_group(samples=2)
    first = reconcile(obs)
    one = reconcile(after(obs, first, loads=HOT))
    even = {q: 10.0 for q in Q}
    calm = reconcile(after(obs, one, previous=first.document, loads=even))
    assert calm.load_state == LoadState()
    again = reconcile(after(obs, calm, previous=first.document, loads=HOT))
    assert again.document is None
    assert again.load_state == LoadState(over=1)


def test_a_membership_change_balances_load_at_once_and_says_so_by_its_own_reason() -> None:
    obs = load_group()
    first = reconcile(obs)
    joined = reconcile(after(obs, first, loads=HOT, pods=[member("p1"), member("p2"), member("p3")]))
    assert joined.document is not None
    assert joined.document.reason == "member-joined"
    loads = loads_of(joined, HOT)
    assert max(loads.values()) <= 1.1 * 50.0 + 1e-9


def test_without_rates_a_load_balanced_assignment_is_kept_until_members_change() -> None:
    obs = load_group()
    first = reconcile(obs)
    one = reconcile(after(obs, first, loads=HOT))
    two = reconcile(after(obs, one, previous=first.document, loads=HOT))
    assert two.document is not None
    uneven = after(obs, two, loads=None)  # e.g. an operator restarted: no rates yet
    assert reconcile(uneven).document is None
    joined = reconcile(replace(uneven, pods=[member("p1"), member("p2"), member("p3")]))
    assert joined.document is not None
    assert sorted(len(qs) for qs in joined.document.topics["T"].values()) == [1, 1, 2]  # STICKY's


def test_a_load_move_goes_through_the_release_handover_and_is_not_undone_meanwhile() -> None:
    obs = load_group(handover="Release")
    first = reconcile(obs)
    one = reconcile(after(obs, first, loads=HOT))
    revoke = reconcile(after(obs, one, previous=first.document, loads=HOT))
    assert revoke.document is not None
    assert revoke.document.reason == LOAD_IMBALANCE
    assert [r.owner for r in revoke.document.releasing] == ["p1"]
    moving = revoke.document.releasing[0].queues
    assert len(moving) == 1
    # New readings while p1 has not released it yet: the revocation stands.
    waiting = after(obs, revoke, loads=HOT)
    for i in range(3):
        out = reconcile(replace(waiting, now=T0 + 1 + i))
        assert out.document is None
        waiting = after(waiting, out)
    # p1 acknowledges: the queue goes to p2.
    done = reconcile(replace(waiting, acks={"p1": Ack(revoke.document.generation)}))
    assert done.document is not None
    assert done.document.reason == "released"
    assert moving[0] in done.document.topics["T"]["p2"]
    assert not done.document.releasing


# -- the lag loop feeds the rates -------------------------------------------------------------------


def test_queue_rates_and_the_load_spread() -> None:
    from mqbalance.lag import Sample

    a, b = MessageQueue("t", "b", 0), MessageQueue("t", "b", 1)
    before = Sample(0.0, {a: QueueOffsets(10, 0), b: QueueOffsets(50, 0)})
    now = Sample(
        10.0, {a: QueueOffsets(110, 0), b: QueueOffsets(40, 0), MessageQueue("t", "b", 2): QueueOffsets(5, 0)}
    )
    assert queue_rates(None, now) is None
    assert queue_rates(before, now) == {a: 10.0, b: 0.0}  # a max offset that went back counts 0
    topics = {"t": {"p1": (a,), "p2": (b,), "p3": ()}}
    assert load_spread({a: 9.0, b: 3.0}, topics) == pytest.approx(9.0 / 4.0)
    assert load_spread({a: 0.0}, topics) is None


def test_the_load_spread_is_a_gauge_once_known() -> None:
    registry = CollectorRegistry()
    figures = [
        ("ns", "g", LagFigures(0, 1.0, 2.0, (), (), True, load_spread=1.25)),
        ("ns", "h", LagFigures(0, None, None, (), (), True)),
    ]
    OperatorMetrics(registry, list, lag=lambda: figures)
    assert registry.get_sample_value("mqbalance_group_load_spread", {"namespace": "ns", "group": "g"}) == 1.25
    assert registry.get_sample_value("mqbalance_group_load_spread", {"namespace": "ns", "group": "h"}) is None


@pytest.mark.asyncio
async def test_rates_from_the_lag_loop_rebalance_a_load_aware_group_after_samples_readings() -> None:
    strategy = {"name": "STICKY", "load": {"tolerance": 0.1, "samples": 2}}
    async with Harness() as h:
        await start(h, group(debounce=1.0, strategy=strategy), [pod("p1"), pod("p2")])
        c = h.world
        state = c.groups[(NS, "g")]
        assert h.published_generations() == [1]
        assert state.load.aware
        reader = FakeReader()
        times = iter(range(0, 1000, 10))
        poller = LagPoller(
            c, reader, LagSettings(interval=1), h.metrics, monotonic=lambda: float(next(times))
        )
        doc = state.publication.configmap.document  # type: ignore[union-attr]
        assert doc is not None
        queues = sorted(q for qs in doc.topics["t"].values() for q in qs)
        rate = {q: (50 if q == queues[0] else 10) for q in queues}
        stored = dict.fromkeys(queues, 0)

        async def reading() -> None:
            for q in queues:
                stored[q] += rate[q] * 10
            reader.answer = GroupOffsets({q: QueueOffsets(n, n) for q, n in stored.items()}, requests=1)
            await poller.poll_once()
            await h.settle()
            h.timer.advance(1.0)  # the debounce window
            await h.settle()

        await reading()  # the first reading: no rates yet
        assert not state.load.rates
        await reading()
        assert state.load.rates is not None
        assert state.load.state == LoadState(over=1)
        assert (state.publication.status or {})["lag"]["loadSpread"] == pytest.approx(1.5)
        # Reconciles for other reasons do not count as readings.
        for _ in range(3):
            c.enqueue(state)
            await h.settle()
        assert state.load.state == LoadState(over=1)
        assert h.published_generations() == [1]
        await reading()
        assert h.published_generations() == [1, 2]
        assert h.journal.records[-1].reason == LOAD_IMBALANCE
        assert h.counter("mqbalance_rebalances_total", reason=LOAD_IMBALANCE) == 1
        for _ in range(3):
            await reading()
        assert h.published_generations() == [1, 2]
        assert (state.publication.status or {})["lag"]["loadSpread"] == pytest.approx(50 / 40)


@pytest.mark.asyncio
async def test_a_group_without_load_keeps_no_rates() -> None:
    async with Harness() as h:
        await start(h, group(strategy={"name": "STICKY"}), [pod("p1")])
        state = h.world.groups[(NS, "g")]
        h.world.record_rates(state, {MessageQueue("t", "b", 0): 5.0})
        assert state.load.rates is None
        assert not state.load.aware
