"""Load-aware STICKY beside STICKY and AVG: one queue carrying ten times the traffic of the others.

    python bench/bench_load.py [--queues 32 --members 8 --trials 100 --jitter-samples 200]

Each trial: ``--queues`` queues on two brokers in two zones, ``--members`` members split
over the zones (random pod ids, so the sorted order differs per trial), every queue at
100 msg/s but one, chosen at random, at 1000 msg/s. Every strategy starts from its own
first assignment of the group and is then fed one sample after another, as an operator
would feed it measured rates: first ``--settle-samples`` samples of the exact rates
(converging), then ``--jitter-samples`` samples where every queue's rate is drawn afresh
within ``--jitter`` of its own (staying put). AVG and STICKY never move a queue without
a membership change, so their spread is what counting queues leaves.

Columns, summed or taken as the worst over the trials:

- load spread: the busiest member's rate over the mean member's, at the end of the
  converging samples (mean and worst over trials), and the worst seen under jitter;
- moved: queues moved while converging and while under jitter;
- fewest: the fewest moves any assignment needs to bring every member within the
  strategy's settle level from where it started, or within its limit where the count floor
  (``least``) keeps the settle level out of reach, or within the best reachable where both
  are (exact for one hot queue among equal ones); "ratio" is moved / fewest;
- queues: the most queues one member held; cross-zone: holdings outside their zone at the end.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mqbalance.model import Assignment, LoadBalance, MessageQueue, StrategyName, StrategySpec, Zones
from mqbalance.strategies import LoadState, allocate, balance_load
from mqbalance.strategies.load import load_limit, member_loads, queue_floor

ZONES = ("zone-a", "zone-b")
BASE_RATE = 100.0
HOT_RATE = 1000.0


@dataclass
class Tally:
    settle_spreads: list[float] = field(default_factory=list)
    jitter_spread: float = 0.0
    settle_moves: int = 0
    jitter_moves: int = 0
    join_moves: int = 0
    join_spreads: list[float] = field(default_factory=list)
    floor: int = 0
    max_queues: int = 0
    cross_zone: int = 0


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    body = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def spread(assignment: Assignment, loads: Mapping[MessageQueue, float]) -> float:
    totals = list(member_loads(assignment, loads).values())
    return max(totals) / (sum(totals) / len(totals))


def moved(before: Assignment, after: Assignment) -> int:
    owner = {mq: member for member, share in before.items() for mq in share}
    return sum(1 for member, share in after.items() for mq in share if owner.get(mq, member) != member)


def fewest(assignment: Assignment, hot: MessageQueue, levels: Sequence[float], least: int) -> int:
    """The fewest moves after which every member is within the first of ``levels`` that any
    assignment within the count floor reaches (else within the best reachable), for one hot
    queue among equal ones, the other members having room: either the hot queue's holder keeps
    it and sheds equal queues, or the hot queue goes to another member, which sheds equal
    queues to make room for it."""
    best = HOT_RATE + BASE_RATE * (least - 1)  # the hot queue's holder keeps `least` queues
    target = next((level for level in levels if best <= level * (1 + 1e-9)), best)

    def shed(others: int) -> int:
        return max(0, math.ceil((HOT_RATE + BASE_RATE * others - target) / BASE_RATE - 1e-9))

    holder = next(member for member, share in assignment.items() if hot in share)
    keep = shed(len(assignment[holder]) - 1)
    give = min(
        (1 + shed(len(share)) for member, share in assignment.items() if member != holder), default=keep
    )
    return min(keep, give)


def cross_zone(assignment: Assignment, zones: Zones) -> int:
    return sum(
        1
        for member, share in assignment.items()
        for mq in share
        if zones.of_consumer(member) != zones.of_broker(mq.broker_name)
    )


def trial(args: argparse.Namespace, rnd: random.Random, tallies: dict[str, Tally]) -> None:
    brokers = {f"broker-{z}": zone for z, zone in enumerate(ZONES)}
    queues = [MessageQueue("orders", broker, i) for i in range(args.queues // 2) for broker in brokers]
    members = [f"orders-{rnd.randrange(16**6):06x}" for _ in range(args.members + 1)]
    zones = Zones(brokers, {m: ZONES[i % len(ZONES)] for i, m in enumerate(members)})
    joiner = members.pop()
    rates = dict.fromkeys(queues, BASE_RATE)
    hot = rnd.choice(queues)
    rates[hot] = HOT_RATE

    def jittered(count: int) -> list[dict[MessageQueue, float]]:
        return [
            {mq: r * rnd.uniform(1 - args.jitter, 1 + args.jitter) for mq, r in rates.items()}
            for _ in range(count)
        ]

    # (phase, members, rates) per sample: converge, stay put under jitter, a member joins.
    samples = (
        [("settle", members, rates)] * args.settle_samples
        + [("jitter", members, loads) for loads in jittered(args.jitter_samples)]
        + [("join", [*members, joiner], loads) for loads in jittered(args.join_samples)]
    )
    setting = LoadBalance(args.tolerance, args.samples, args.max_queue_factor)
    specs = {
        "AVG": StrategySpec(StrategyName.AVG),
        "STICKY": StrategySpec(StrategyName.STICKY),
        "STICKY+zoneAffinity": StrategySpec(StrategyName.STICKY, zone_affinity=True),
        "STICKY+load": StrategySpec(StrategyName.STICKY, load=setting),
        "STICKY+zoneAffinity+load": StrategySpec(StrategyName.STICKY, zone_affinity=True, load=setting),
    }
    for label, spec in specs.items():
        tally = tallies[label]
        # Load-aware: from STICKY's first assignment (with its zone affinity), as balance_load starts.
        now = allocate(
            StrategySpec(spec.name, zone_affinity=spec.zone_affinity), queues, members, zones=zones
        )
        if spec.load is not None:
            levels = [
                load_limit(rates.values(), len(members), setting, settle=settle) for settle in (True, False)
            ]
            tally.floor += fewest(now, hot, levels, queue_floor(len(queues), len(members), setting))
        state = LoadState()
        for index, (phase, group, loads) in enumerate(samples):
            if spec.load is None:
                after = allocate(spec, queues, group, zones=zones, previous=now)
            else:
                outcome = balance_load(
                    queues,
                    group,
                    loads=loads,
                    previous=now,
                    zones=zones,
                    zone_affinity=spec.zone_affinity,
                    settings=spec.load,
                    state=state,
                )
                after, state = outcome.assignment, outcome.state
            step = moved(now, after)
            now = after
            if phase == "settle":
                tally.settle_moves += step
            elif phase == "jitter":
                tally.jitter_moves += step
                tally.jitter_spread = max(tally.jitter_spread, spread(now, loads))
            else:
                tally.join_moves += step
            if index == args.settle_samples - 1:
                tally.settle_spreads.append(spread(now, rates))
            tally.max_queues = max(tally.max_queues, *(len(share) for share in now.values()))
        tally.join_spreads.append(spread(now, rates))
        tally.cross_zone += cross_zone(now, zones)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queues", type=int, default=32, help="queues, half on each of two brokers")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--settle-samples", type=int, default=3, help="samples of the exact rates first")
    parser.add_argument("--jitter-samples", type=int, default=200)
    parser.add_argument("--join-samples", type=int, default=20, help="samples after a member joins")
    parser.add_argument("--jitter", type=float, default=0.1, help="each sample's rate within this fraction")
    parser.add_argument("--tolerance", type=float, default=LoadBalance.tolerance)
    parser.add_argument("--samples", type=int, default=LoadBalance.samples, help="hysteresis samples")
    parser.add_argument("--max-queue-factor", type=float, default=LoadBalance.max_queue_factor)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    labels = ("AVG", "STICKY", "STICKY+zoneAffinity", "STICKY+load", "STICKY+zoneAffinity+load")
    tallies = {label: Tally() for label in labels}
    rnd = random.Random(args.seed)
    start = time.perf_counter()
    for _ in range(args.trials):
        trial(args, rnd, tallies)
    elapsed = time.perf_counter() - start
    mean_rate = (HOT_RATE + BASE_RATE * (args.queues - 1)) / args.members
    print(
        f"{args.queues} queues (one at {HOT_RATE:g} msg/s, the rest at {BASE_RATE:g}), "
        f"{args.members} members in {len(ZONES)} zones, {args.trials} trials; "
        f"mean member {mean_rate:g} msg/s; "
        f"tolerance {args.tolerance:g}, samples {args.samples}, maxQueueFactor {args.max_queue_factor:g}; "
        f"{args.settle_samples} samples, then {args.jitter_samples} within ±{args.jitter:g}, "
        f"then a member joins and {args.join_samples} more; {elapsed:.1f} s"
    )
    print()
    rows = []
    for label in labels:
        t = tallies[label]
        load_aware = label.endswith("+load")
        rows.append(
            (
                label,
                f"{sum(t.settle_spreads) / len(t.settle_spreads):.3f}",
                t.settle_moves,
                t.floor if load_aware else "-",
                f"{t.settle_moves / t.floor:.2f}x" if load_aware and t.floor else "-",
                t.jitter_moves,
                f"{t.jitter_spread:.3f}",
                t.join_moves,
                f"{sum(t.join_spreads) / len(t.join_spreads):.3f}",
                t.max_queues,
                t.cross_zone,
            )
        )
    print(
        table(
            (
                "strategy",
                "load spread converged",
                "moved converging",
                "fewest",
                "ratio",
                "moved under jitter",
                "worst spread under jitter",
                "moved on join",
                "load spread after join",
                "most queues",
                "cross-zone",
            ),
            rows,
        )
    )


if __name__ == "__main__":
    main()
