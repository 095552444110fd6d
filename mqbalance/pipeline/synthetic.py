"""Deterministic synthetic churn for what-if replays at any scale.

Each group's history depends only on the seed and the group's index, never on
which machine or partition generates it, so Spark executors generate their own
groups from the seed (no driver memory) and a single-process replay of the same
settings sees exactly the same events.

A group starts with one broker per zone, ``queues`` read queues per broker on
each of its topics, and a member count drawn from ``members``; every later event
applies one change drawn from the mix: a pod joins (in a random zone), a pod
leaves, a pod's zone changes, or a broker's read queue count on one topic changes.

With ``rate_skew`` s > 0 every queue also carries a rate (messages/s), Zipf-distributed: the
group's possible queues are ranked at random once and the queue of rank k gets
``1000 / k**s``, times a jitter within ``rate_jitter`` drawn afresh at every event. The rates
come from a generator of their own, so the churn itself is the same with or without them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from mqbalance.pipeline.events import DEFAULT_STRATEGY, Event

NAMESPACE = "synthetic"
MIX_KINDS = ("join", "leave", "zone", "queues")


def parse_range(text: str, what: str) -> tuple[int, int]:
    """``"4"`` or ``"2-8"`` as an inclusive range of positive integers."""
    lo_text, _, hi_text = text.partition("-")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if hi_text else lo
    except ValueError:
        raise ValueError(f"{what} must be N or LO-HI (positive integers), got {text!r}") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"{what} must be N or LO-HI with 1 <= LO <= HI, got {text!r}")
    return lo, hi


def parse_mix(text: str) -> dict[str, float]:
    """``"join=3,leave=3,zone=1,queues=1"``: relative weights of the change kinds."""
    mix = dict.fromkeys(MIX_KINDS, 0.0)
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, weight = part.partition("=")
        if not sep or kind not in mix:
            raise ValueError(
                f"--mix entries are KIND=WEIGHT with KIND one of {', '.join(MIX_KINDS)}; got {part!r}"
            )
        try:
            mix[kind] = float(weight)
        except ValueError:
            raise ValueError(f"--mix weight of {kind!r} must be a number, got {weight!r}") from None
        if mix[kind] < 0:
            raise ValueError(f"--mix weight of {kind!r} must not be negative")
    if sum(mix.values()) <= 0:
        raise ValueError("--mix needs at least one positive weight")
    return mix


@dataclass(frozen=True)
class Churn:
    """Settings of the synthetic churn generator."""

    groups: int = 100
    events_per_group: int = 20
    zones: int = 3
    queues: tuple[int, int] = (4, 4)
    """Read queues per broker and topic at the start (a range draws per group)."""
    members: tuple[int, int] = (2, 8)
    """Members at the start (a range draws per group)."""
    topics: int = 1
    mix: dict[str, float] = field(
        default_factory=lambda: {"join": 3.0, "leave": 3.0, "zone": 1.0, "queues": 1.0}
    )
    seed: int = 1
    rate_skew: float = 0.0
    """Zipf exponent of the per-queue rates; 0: no rates."""
    rate_jitter: float = 0.1
    """Each rate varies by up to this fraction from event to event."""

    def __post_init__(self) -> None:
        for name in ("groups", "events_per_group", "zones", "topics"):
            if getattr(self, name) < 1:
                raise ValueError(f"synthetic {name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.rate_skew <= 10:
            raise ValueError(f"synthetic rate skew must be from 0 to 10, got {self.rate_skew}")
        if not 0 <= self.rate_jitter < 1:
            raise ValueError(f"synthetic rate jitter must be from 0 to below 1, got {self.rate_jitter}")

    @property
    def total_events(self) -> int:
        return self.groups * self.events_per_group


def zone_name(index: int) -> str:
    return f"zone-{index}"


def group_events(churn: Churn, index: int) -> Iterator[Event]:
    """The whole history of synthetic group ``index``, in order."""
    # Seeding with a string is deterministic across processes (no hash randomization).
    rng = random.Random(f"{churn.seed}/{index}")
    group = f"group-{index:07d}"
    zones = [zone_name(z) for z in range(churn.zones)]
    broker_zones = {f"broker-{z}": zone for z, zone in enumerate(zones)}
    per_broker = rng.randint(*churn.queues)
    queues = {f"topic-{t}": {broker: per_broker for broker in broker_zones} for t in range(churn.topics)}
    members: dict[str, str] = {}
    next_pod = 0

    def join() -> None:
        nonlocal next_pod
        members[f"{group}-{next_pod:04d}"] = rng.choice(zones)
        next_pod += 1

    for _ in range(rng.randint(*churn.members)):
        join()
    base_rates: dict[tuple[str, str, int], float] = {}
    rates_rng = random.Random(f"{churn.seed}/{index}/rates")
    if churn.rate_skew > 0:
        possible = [
            (topic, broker, i)
            for topic in sorted(queues)
            for broker in broker_zones
            for i in range(2 * churn.queues[1])
        ]
        rates_rng.shuffle(possible)
        base_rates = {key: 1000.0 / (rank + 1) ** churn.rate_skew for rank, key in enumerate(possible)}

    def rates_now() -> dict[str, dict[str, list[float]]]:
        if not base_rates:
            return {}
        jitter = churn.rate_jitter
        return {
            topic: {
                broker: [
                    round(base_rates[(topic, broker, i)] * rates_rng.uniform(1 - jitter, 1 + jitter), 3)
                    for i in range(n)
                ]
                for broker, n in by_broker.items()
            }
            for topic, by_broker in queues.items()
        }

    kinds = [k for k in MIX_KINDS if churn.mix.get(k, 0) > 0]
    weights = [churn.mix[k] for k in kinds]
    time = 1_700_000_000.0 + index
    reason = "initial"
    for seq in range(churn.events_per_group):
        if seq:
            time = round(time + rng.expovariate(1 / 30.0), 3)
            reason = rng.choices(kinds, weights)[0]
            if reason == "leave" and len(members) <= 1:
                reason = "join"
            if reason == "join":
                join()
            elif reason == "leave":
                del members[rng.choice(sorted(members))]
            elif reason == "zone":
                pod = rng.choice(sorted(members))
                members[pod] = rng.choice([z for z in zones if z != members[pod]] or zones)
            else:
                topic = rng.choice(sorted(queues))
                broker = rng.choice(sorted(broker_zones))
                counts = [n for n in range(1, 2 * churn.queues[1] + 1) if n != queues[topic][broker]]
                queues[topic][broker] = rng.choice(counts or [1])
        yield Event(
            namespace=NAMESPACE,
            group=group,
            seq=seq,
            time=time,
            reason=reason,
            members=dict(members),
            broker_zones=dict(broker_zones),
            queues={t: {b: list(range(n)) for b, n in by_broker.items()} for t, by_broker in queues.items()},
            strategy=dict(DEFAULT_STRATEGY),
            rates=rates_now(),
        )


def events(churn: Churn, first: int = 0, stop: int | None = None) -> Iterator[Event]:
    """Events of groups ``first`` up to ``stop`` (all groups by default), group by group."""
    for index in range(first, churn.groups if stop is None else min(stop, churn.groups)):
        yield from group_events(churn, index)
