"""The costliest groups the bounds allow (mqbalance/contract/bounds.py): CPU and memory of one reconcile.

    python bench/bench_bounds.py [--rounds 3]

Each case is the pure reconcile of one group (what the operator runs for it, off its event loop when
the group is large): its first publication, then a member leaving (the handover step and the
fewest-moves figure make that the costlier one). CPU seconds are the process's own time over
``--rounds`` rounds (minimum and median; the cases rotate each round, so a busy machine slows them
alike); peak is what the reconcile allocated on top of what was there (tracemalloc, in a round of its
own, since tracing slows Python down).
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from dataclasses import replace
from typing import Any

from mqbalance.contract.bounds import (
    MAX_MEMBERS_PER_GROUP,
    MAX_QUEUES_PER_GROUP,
    MAX_QUEUES_TIMES_MEMBERS,
    MAX_TOPICS_PER_GROUP,
)
from mqbalance.operator.membership import PodInfo
from mqbalance.operator.reconcile import Observed, Outcome, reconcile

NODES = {f"n{i}": {"topology.kubernetes.io/zone": f"zone-{i}"} for i in range(3)}


def group(per_broker: int, members: int, strategy: dict[str, Any]) -> Observed:
    """64 topics of 4 brokers in three zones, ``per_broker`` queues each; ``members`` pods."""
    topics = {
        f"t{t:02d}": {
            "brokers": [
                {
                    "name": f"b{b}",
                    "zone": f"zone-{b % 3}",
                    "readQueueNums": per_broker,
                    "writeQueueNums": per_broker,
                }
                for b in range(4)
            ]
        }
        for t in range(MAX_TOPICS_PER_GROUP)
    }
    pods = [PodInfo(f"c{i:03d}", {"app": "a"}, f"n{i % 3}", True, True) for i in range(members)]
    spec = {"topics": list(topics), "selector": {"matchLabels": {"app": "a"}}, "strategy": strategy}
    return Observed("ns", "g", spec, topics, pods, NODES, None, 1_800_000_000.0, 1)


def leaving(first: Observed, out: Outcome) -> Observed:
    return replace(first, previous=out.document, status=out.status, now=first.now + 10, pods=first.pods[1:])


def measure(first: Observed) -> tuple[float, float]:
    """CPU seconds of the group's first publication and of a member leaving after it."""
    began = time.process_time()
    out = reconcile(first)
    published = time.process_time() - began
    then = leaving(first, out)
    began = time.process_time()
    reconcile(then)
    return published, time.process_time() - began


def peaks(first: Observed) -> tuple[float, float]:
    """MiB allocated at the peak of the same two reconciles (tracemalloc)."""
    out = reconcile(first)
    found = []
    for observed in (first, leaving(first, out)):
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            reconcile(observed)
            found.append((tracemalloc.get_traced_memory()[1] - before) / 2**20)
        finally:
            tracemalloc.stop()
    return found[0], found[1]


STICKY_ZONES: dict[str, Any] = {"name": "STICKY", "zoneAffinity": True}
MOST_QUEUES_MEMBERS = MAX_QUEUES_TIMES_MEMBERS // MAX_QUEUES_PER_GROUP
MOST_MEMBERS_QUEUES = MAX_QUEUES_TIMES_MEMBERS // MAX_MEMBERS_PER_GROUP
CASES: dict[str, tuple[int, int, dict[str, Any]]] = {
    f"STICKY zoneAffinity, {MAX_QUEUES_PER_GROUP:,} queues, {MOST_QUEUES_MEMBERS} members": (
        MAX_QUEUES_PER_GROUP // (4 * MAX_TOPICS_PER_GROUP),
        MOST_QUEUES_MEMBERS,
        STICKY_ZONES,
    ),
    f"STICKY zoneAffinity, {MOST_MEMBERS_QUEUES:,} queues, {MAX_MEMBERS_PER_GROUP} members": (
        MOST_MEMBERS_QUEUES // (4 * MAX_TOPICS_PER_GROUP),
        MAX_MEMBERS_PER_GROUP,
        STICKY_ZONES,
    ),
    f"AVG, {MAX_QUEUES_PER_GROUP:,} queues, {MOST_QUEUES_MEMBERS} members": (
        MAX_QUEUES_PER_GROUP // (4 * MAX_TOPICS_PER_GROUP),
        MOST_QUEUES_MEMBERS,
        {"name": "AVG"},
    ),
    f"CONSISTENT_HASH (1,000 nodes), {MOST_MEMBERS_QUEUES:,} queues, {MAX_MEMBERS_PER_GROUP} members": (
        MOST_MEMBERS_QUEUES // (4 * MAX_TOPICS_PER_GROUP),
        MAX_MEMBERS_PER_GROUP,
        {"name": "CONSISTENT_HASH", "virtualNodes": 1000},
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    names = list(CASES)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(measure(group(*CASES[name])))
            published, left = times[name][-1]
            print(f"round {r + 1}/{args.rounds}: {name}: {published:.2f} s, {left:.2f} s", flush=True)
    print()
    print(
        "| group | publish: CPU s min / median | a member leaves: min / median | peak MiB publish / leave |"
    )
    print("|---|---:|---:|---:|")
    for name in names:
        publish, leave = [t[0] for t in times[name]], [t[1] for t in times[name]]
        high = peaks(group(*CASES[name]))
        print(
            f"| {name} | {min(publish):.2f} / {statistics.median(publish):.2f} | "
            f"{min(leave):.2f} / {statistics.median(leave):.2f} | {high[0]:.1f} / {high[1]:.1f} |"
        )


if __name__ == "__main__":
    main()
