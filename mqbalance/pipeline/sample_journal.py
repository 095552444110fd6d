"""A sample rebalance journal, written as the operator writes it, from synthetic churn.

Groups take turns running each strategy (with non-default parameters, CONFIG,
MACHINE_ROOM, BROADCASTING and a strategy change halfway), the assignment of each
record is computed with the core library as the operator would, and the records
are mixed with other log lines and one broken record, as in a real operator log.
Used by the tests and to try ``mqbalance replay`` without a cluster:

    python -m mqbalance.pipeline.sample_journal operator.log
    mqbalance replay --journal operator.log --out replay-out
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from mqbalance.journal import JournalRecord
from mqbalance.model import Assignment, MessageModel, MessageQueue, StrategyName, StrategySpec, Zones
from mqbalance.pipeline import synthetic
from mqbalance.pipeline.events import Event
from mqbalance.quality import measure
from mqbalance.strategies import allocate

BROKEN_RECORD = '{"kind": "mqbalance.rebalance", "namespace": "shop", "group": "truncated"'


def _strategies(index: int, event: Event, events: int) -> tuple[StrategySpec, MessageModel]:
    turn = index % 8
    if turn == 0:
        return StrategySpec(StrategyName.STICKY, zone_affinity=True), MessageModel.CLUSTERING
    if turn == 1:
        return StrategySpec(StrategyName.AVG), MessageModel.CLUSTERING
    if turn == 2:
        return StrategySpec(StrategyName.CONSISTENT_HASH, virtual_nodes=5), MessageModel.CLUSTERING
    if turn == 3:
        spec = StrategySpec(StrategyName.MACHINE_ROOM_NEARBY, inner=StrategyName.CONSISTENT_HASH)
        return spec, MessageModel.CLUSTERING
    if turn == 4:
        # Two fixed pods share broker-0's first queues; everyone else gets nothing.
        pods = sorted(event.members)[:2]
        config = {
            pod: tuple(MessageQueue("", "zone-0@broker-0", q) for q in range(i, 4, 2))
            for i, pod in enumerate(pods)
        }
        return StrategySpec(StrategyName.CONFIG, config=config), MessageModel.CLUSTERING
    if turn == 5:
        return StrategySpec(
            StrategyName.MACHINE_ROOM, consumer_idcs=frozenset({"zone-0", "zone-1"})
        ), MessageModel.CLUSTERING
    if turn == 6:
        return StrategySpec(StrategyName.STICKY), MessageModel.BROADCASTING
    # A group that switches from AVG to STICKY halfway through its history.
    name = StrategyName.AVG if event.seq < events // 2 else StrategyName.STICKY
    return StrategySpec(name), MessageModel.CLUSTERING


def records(churn: synthetic.Churn, namespace: str = "shop") -> Iterator[JournalRecord]:
    """Journal records of every synthetic group, group by group, as the operator would log them."""
    config_by_group: dict[str, StrategySpec] = {}
    for index in range(churn.groups):
        previous: dict[str, Assignment] = {}
        for generation, event in enumerate(synthetic.group_events(churn, index), start=1):
            # MACHINE_ROOM reads the idc from broker names of the form idc@broker.
            broker_zones = {f"{zone}@{broker}": zone for broker, zone in event.broker_zones.items()}
            queues = {
                topic: [
                    MessageQueue(topic, f"{event.broker_zones[b]}@{b}", q)
                    for b, ids in by_broker.items()
                    for q in ids
                ]
                for topic, by_broker in event.queues.items()
            }
            spec, model = _strategies(index, event, churn.events_per_group)
            if spec.name is StrategyName.CONFIG:
                # A group's CONFIG map is fixed when the group is created.
                spec = config_by_group.setdefault(event.group, spec)
            zones = Zones(brokers=broker_zones, consumers=event.members)
            assignment: dict[str, Assignment] = {}
            moved = 0
            for topic, mqs in queues.items():
                now = allocate(
                    spec, mqs, event.members, zones=zones, previous=previous.get(topic), message_model=model
                )
                moved += measure(previous.get(topic), now, zones=zones, queues=mqs, message_model=model).moved
                assignment[topic] = previous[topic] = now
            yield JournalRecord(
                namespace=namespace,
                group=event.group,
                generation=generation,
                time=event.time,
                reason=event.reason,
                strategy=spec,
                message_model=model.value,
                members=dict(event.members),
                broker_zones=broker_zones,
                queues=queues,
                assignment=assignment,
                moved=moved,
                compute_seconds=0.0,
            )


def lines(churn: synthetic.Churn) -> Iterator[str]:
    """Log lines: records (some after a logger prefix) among other log output and one broken record."""
    for n, record in enumerate(records(churn)):
        if n % 3 == 0:
            yield f"[2026-01-01 00:00:{n % 60:02d},000] kopf.objects [INFO] reconciled {record.group}"
        prefix = "[2026-01-01 00:00:00,000] mqbalance.journal [INFO] " if n % 4 == 1 else ""
        yield prefix + record.encode()
        if n == 5:
            yield BROKEN_RECORD
    yield "[2026-01-01 00:01:00,000] kopf.reactor.running [INFO] stopped"


def write(path: Path, churn: synthetic.Churn) -> int:
    """Write the sample journal; returns the number of lines."""
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for line in lines(churn):
            out.write(line + "\n")
            count += 1
    return count


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m mqbalance.pipeline.sample_journal OUTPUT.log", file=sys.stderr)
        return 2
    churn = synthetic.Churn(groups=16, events_per_group=12, seed=7)
    print(f"{write(Path(argv[0]), churn)} lines written to {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
