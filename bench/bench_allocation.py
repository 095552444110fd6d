"""Allocation benchmark: full-group time against its floor, and movement against the minimum.

    python bench/bench_allocation.py [--queues 10000 --consumers 1000] [--repeat 5]

Part 1 times one full-group allocation per strategy beside its floor, measured in the
same run: sorting the queues (plus, for CONSISTENT_HASH, hashing every queue key and
every virtual node once). Best of --repeat runs, time.perf_counter.

Part 2 counts the queues each strategy moves per membership change and divides by the
minimum any balanced assignment allows (quality.minimum_moves): 128 queues, a group of
7 gaining an 8th member with random ids (--trials), then a random join/leave sequence
(--steps). STICKY must stay at 1.00x. A ratio below 1 means the strategy left the
group unbalanced (see the max-load column).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import random
import time
from collections.abc import Callable, Sequence

from mqbalance.model import (
    Assignment,
    MessageQueue,
    StrategyName,
    StrategySpec,
    Zones,
    sort_queues,
)
from mqbalance.quality import measure
from mqbalance.strategies import allocate

TOPIC = "TopicTest"
ZONES = ("zone-a", "zone-b", "zone-c")


def make_queues(count: int, brokers: int = 10) -> list[MessageQueue]:
    """Brokers named ``roomN@broker-i`` so that MACHINE_ROOM has work to do."""
    per_broker = -(-count // brokers)
    queues = [
        MessageQueue(TOPIC, f"room{b % 2 + 1}@broker-{b}", i)
        for b in range(brokers)
        for i in range(per_broker)
    ]
    return queues[:count]


def make_consumers(count: int, rnd: random.Random) -> list[str]:
    return [
        f"10.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(256)}@{rnd.randrange(1, 65536)}"
        for _ in range(count)
    ]


def make_zones(queues: Sequence[MessageQueue], consumers: Sequence[str]) -> Zones:
    brokers = sorted({mq.broker_name for mq in queues})
    return Zones(
        {b: ZONES[i % len(ZONES)] for i, b in enumerate(brokers)},
        {c: ZONES[i % len(ZONES)] for i, c in enumerate(consumers)},
    )


def specs(queues: Sequence[MessageQueue], consumers: Sequence[str]) -> dict[str, StrategySpec]:
    config = allocate(StrategySpec(StrategyName.AVG), queues, consumers)
    topicless = {
        c: tuple(MessageQueue("", mq.broker_name, mq.queue_id) for mq in share) for c, share in config.items()
    }
    return {
        "AVG": StrategySpec(StrategyName.AVG),
        "AVG_BY_CIRCLE": StrategySpec(StrategyName.AVG_BY_CIRCLE),
        "CONSISTENT_HASH": StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=10),
        "CONFIG": StrategySpec(StrategyName.CONFIG, config=topicless),
        "MACHINE_ROOM": StrategySpec(StrategyName.MACHINE_ROOM, consumer_idcs=frozenset({"room1", "room2"})),
        "MACHINE_ROOM_NEARBY (AVG)": StrategySpec(StrategyName.MACHINE_ROOM_NEARBY),
        "MACHINE_ROOM_NEARBY (CONSISTENT_HASH)": StrategySpec(
            StrategyName.MACHINE_ROOM_NEARBY, inner=StrategyName.CONSISTENT_HASH
        ),
        "STICKY": StrategySpec(StrategyName.STICKY),
        "STICKY zoneAffinity": StrategySpec(StrategyName.STICKY, zone_affinity=True),
    }


def best_of(repeat: int, work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def timing(queue_count: int, consumer_count: int, repeat: int) -> None:
    rnd = random.Random(7)
    queues = make_queues(queue_count)
    rnd.shuffle(queues)
    consumers = make_consumers(consumer_count, rnd)
    zones = make_zones(queues, consumers)
    # STICKY is timed on a membership change: the group as AVG left it, one member gone, one new.
    before = allocate(StrategySpec(StrategyName.AVG), queues, consumers)
    changed = [*consumers[1:], "10.255.255.255@1"]

    def md5_all(keys: Sequence[str]) -> None:
        for key in keys:
            hashlib.md5(key.encode()).digest()

    sort_floor = best_of(repeat, lambda: sort_queues(queues))
    ring_keys = [f"{c}-{i}" for c in consumers for i in range(10)]
    queue_keys = [str(mq) for mq in queues]
    hash_floor = sort_floor + best_of(repeat, lambda: md5_all(ring_keys + queue_keys))

    size = f"{len(queues):,} queues x {len(consumers):,} consumers"
    print(f"## Full-group allocation: {size} (best of {repeat})\n")
    print("| strategy | full group | floor | ratio |")
    print("|---|---:|---:|---:|")
    for name, spec in specs(queues, consumers).items():
        hashed = spec.name == StrategyName.CONSISTENT_HASH or (
            spec.name == StrategyName.MACHINE_ROOM_NEARBY and spec.inner == StrategyName.CONSISTENT_HASH
        )
        floor = hash_floor if hashed else sort_floor
        if spec.name == StrategyName.STICKY:
            work = functools.partial(allocate, spec, queues, changed, zones=zones, previous=before)
        else:
            work = functools.partial(allocate, spec, queues, consumers, zones=zones)
        elapsed = best_of(repeat, work)
        print(f"| {name} | {elapsed * 1000:.1f} ms | {floor * 1000:.1f} ms | {elapsed / floor:.2f}x |")
    print()


class Tally:
    def __init__(self) -> None:
        self.moved = self.minimum = self.max_load = self.unassigned = 0

    def add(
        self, previous: Assignment, current: Assignment, queues: Sequence[MessageQueue], zones: Zones
    ) -> None:
        figures = measure(previous, current, zones=zones, queues=queues)
        self.moved += figures.moved
        self.minimum += figures.minimum_moves
        self.max_load = max(self.max_load, figures.max_load)
        self.unassigned = max(self.unassigned, figures.unassigned)

    def row(self, name: str) -> str:
        ratio = f"{self.moved / self.minimum:.2f}x" if self.minimum else "-"
        return f"| {name} | {self.moved} | {self.minimum} | {ratio} | {self.max_load} | {self.unassigned} |"


def movement(trials: int, steps: int) -> None:
    queues = make_queues(128, brokers=4)
    header = (
        "| strategy | moved | minimum | ratio | worst max load | worst unassigned |\n"
        "|---|---:|---:|---:|---:|---:|"
    )

    print(f"## Movement: 128 queues, 7 members gaining an 8th, {trials} random trials\n")
    print(header)
    rnd = random.Random(11)
    groups = [make_consumers(8, rnd) for _ in range(trials)]
    for name in specs(queues, groups[0][:7]):
        tally = Tally()
        for group in groups:
            zones = make_zones(queues, group)
            spec = specs(queues, group[:7])[name]
            before = allocate(spec, queues, group[:7], zones=zones)
            after = allocate(spec, queues, group, zones=zones, previous=before)
            tally.add(before, after, queues, zones)
        print(tally.row(name))
    print()

    print(f"## Movement: 128 queues, {steps} random joins and leaves (4 to 12 members)\n")
    print(header)
    rnd = random.Random(13)
    group = make_consumers(8, rnd)
    sequence = []
    for _ in range(steps):
        if len(group) > 4 and (len(group) >= 12 or rnd.random() < 0.5):
            leaver = rnd.choice(group)
            group = [c for c in group if c != leaver]
        else:
            group = [*group, *make_consumers(1, rnd)]
        sequence.append(group)
    all_members = sorted({c for g in sequence for c in g})
    zones = make_zones(queues, all_members)
    for name in specs(queues, sequence[0]):
        spec = specs(queues, sequence[0])[name]  # CONFIG keeps its first map throughout
        tally = Tally()
        previous = allocate(spec, queues, sequence[0], zones=zones)
        for members in sequence[1:]:
            current = allocate(spec, queues, members, zones=zones, previous=previous)
            tally.add(previous, current, queues, zones)
            previous = current
        print(tally.row(name))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--consumers", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    timing(args.queues, args.consumers, args.repeat)
    movement(args.trials, args.steps)


if __name__ == "__main__":
    main()
