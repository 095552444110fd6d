"""STICKY: balanced, and moving as few queues as any balanced assignment can.

Balanced means loads differ by at most one, so with Q queues and C consumers exactly
``Q % C`` consumers hold ``Q // C + 1`` queues and the rest ``Q // C``. A queue *stays*
when its new owner held it before; every other queue that was held before *moves* (a
queue whose owner left must move; a queue nobody held is new and never a move).

Without zone affinity, and when every queue had at most one previous owner still in the
group, a greedy is exact:

    Let k_c be the number of current queues consumer c held before. Under any balanced
    capacity vector cap, c keeps at most min(k_c, cap_c) queues, so
        kept <= sum_c min(k_c, base) + #{c with the extra slot and k_c >= base + 1}.
    Choosing the ``Q % C`` consumers with the largest k_c for the extra slot maximises
    that bound, and the greedy attains it: each consumer keeps min(k_c, cap_c) of its
    previous queues, and everything else (new queues, queues of departed consumers,
    queues over a consumer's capacity) fills the remaining slots, which add up exactly to
    the queues left. Moves = (queues held before) - kept, so the greedy's moves are the
    minimum. With no previous assignment it gives exactly what AVG gives.

With zone affinity (or a previous assignment that gave a queue to several members, as
BROADCASTING or CONFIG may), it is a transportation problem, solved exactly as a
min-cost flow whose cost is ``(Q + 1) * cross_zone + moves``: the first term dominates,
so it places the most queues in their broker's zone any balanced assignment can, then
moves the fewest among those. With one previous holder per queue, ``sticky_zones.py``
solves it on a network of consumer *types*, a few dozen nodes whatever the group's size
(its proof of optimality is there). Otherwise ``allocate_transport`` below solves it on a
network per consumer; queues are grouped into classes (zone, previous owners), which
keeps the graph to a few nodes per consumer whatever the queue count:

    source -> class            capacity: the class's queues
    class  -> previous owner   cost: (Q + 1) if the zones differ
    class  -> pool of its zone cost: 1 if the class's queues were held before (a move)
    pool   -> every consumer   cost: (Q + 1) if the zones differ
    consumer -> sink           capacity Q // C
    consumer -> extra -> sink  capacity 1 each, then Q % C in total

The flow is Q, which saturates every sink arc, so the capacities are exactly balanced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mqbalance.model import Assignment, MessageQueue, Zones
from mqbalance.strategies.avg import Shares
from mqbalance.strategies.mincostflow import MinCostFlow
from mqbalance.strategies.sticky_zones import allocate_zone_sticky

NO_ZONES = Zones()
"""Every broker and consumer in the unknown zone."""


def previous_holders(previous: Assignment | None, members: Sequence[str]) -> dict[MessageQueue, list[str]]:
    """Queue -> the current members that held it before, in member order."""
    holders: dict[MessageQueue, list[str]] = {}
    if previous:
        for consumer in members:
            for mq in previous.get(consumer, ()):
                owners = holders.setdefault(mq, [])
                if not owners or owners[-1] != consumer:
                    owners.append(consumer)
    return holders


def allocate_sticky(
    queues: Sequence[MessageQueue],
    consumers: Sequence[str],
    *,
    previous: Assignment | None = None,
    zones: Zones = NO_ZONES,
    zone_affinity: bool = False,
) -> Shares:
    """Queues and consumers must be sorted and free of duplicates (the package does that)."""
    if not consumers:
        return {}
    holders = previous_holders(previous, consumers)
    single_owner = all(len(owners) == 1 for owners in holders.values())
    if zone_affinity:
        zone_set = {zones.of_broker(broker) for broker in {mq.broker_name for mq in queues}}
        zone_set.update(zones.of_consumer(c) for c in consumers)
        zone_affinity = len(zone_set) > 1  # one zone: every placement is in-zone
    if single_owner and not zone_affinity:
        return _greedy(queues, consumers, holders)
    if single_owner:
        return allocate_zone_sticky(queues, consumers, holders, zones)
    return allocate_transport(queues, consumers, holders, zones, zone_affinity)


def _greedy(
    queues: Sequence[MessageQueue], consumers: Sequence[str], holders: Mapping[MessageQueue, list[str]]
) -> Shares:
    kept: dict[str, list[MessageQueue]] = {consumer: [] for consumer in consumers}
    for mq in queues:
        owners = holders.get(mq)
        if owners:
            kept[owners[0]].append(mq)
    base, extra = divmod(len(queues), len(consumers))
    # The extra slots go to the consumers that held the most; ties by consumer order.
    ranked = sorted(range(len(consumers)), key=lambda i: (-len(kept[consumers[i]]), i))
    with_extra = set(ranked[:extra])
    shares: Shares = {}
    placed: set[MessageQueue] = set()
    for index, consumer in enumerate(consumers):
        share = kept[consumer][: base + 1 if index in with_extra else base]
        shares[consumer] = share
        placed.update(share)
    rest = [mq for mq in queues if mq not in placed]
    position = 0
    for index, consumer in enumerate(consumers):
        need = (base + 1 if index in with_extra else base) - len(shares[consumer])
        shares[consumer].extend(rest[position : position + need])
        position += need
    return shares


def allocate_transport(
    queues: Sequence[MessageQueue],
    consumers: Sequence[str],
    holders: Mapping[MessageQueue, list[str]],
    zones: Zones,
    zone_affinity: bool,
) -> Shares:
    """The exact solver for any previous assignment (the reference for ``sticky_zones``)."""

    def queue_zone(mq: MessageQueue) -> str:
        return zones.of_broker(mq.broker_name) if zone_affinity else ""

    def consumer_zone(consumer: str) -> str:
        return zones.of_consumer(consumer) if zone_affinity else ""

    # Classes of interchangeable queues, in order of their first queue.
    classes: dict[tuple[str, tuple[str, ...]], list[MessageQueue]] = {}
    for mq in queues:
        classes.setdefault((queue_zone(mq), tuple(holders.get(mq, ()))), []).append(mq)
    pool_zones = sorted({zone for zone, _ in classes})

    source, sink, extra = 0, 1, 2
    pool_node = {zone: 3 + i for i, zone in enumerate(pool_zones)}
    consumer_node = {c: 3 + len(pool_zones) + i for i, c in enumerate(consumers)}
    class_base = 3 + len(pool_zones) + len(consumers)
    graph = MinCostFlow(class_base + len(classes))

    total = len(queues)
    cross = total + 1  # outweighs any number of moves
    base, remainder = divmod(total, len(consumers))

    owner_arcs: list[list[tuple[str, int]]] = []
    source_arcs: list[int] = []
    for index, ((zone, owners), members) in enumerate(classes.items()):
        node = class_base + index
        source_arcs.append(graph.add_arc(source, node, len(members), 0))
        owner_arcs.append(
            [
                (o, graph.add_arc(node, consumer_node[o], total, cross if consumer_zone(o) != zone else 0))
                for o in owners
            ]
        )
        moves = 1 if owners else 0  # the queue had an owner in the group, so leaving it is a move
        graph.add_arc(node, pool_node[zone], total, moves)
    served: dict[str, list[tuple[str, int]]] = {zone: [] for zone in pool_zones}
    for zone in pool_zones:
        for consumer in consumers:
            cost = cross if consumer_zone(consumer) != zone else 0
            served[zone].append(
                (consumer, graph.add_arc(pool_node[zone], consumer_node[consumer], total, cost))
            )
    floor_arcs: dict[str, int] = {}
    for consumer in consumers:
        floor_arcs[consumer] = graph.add_arc(consumer_node[consumer], sink, base, 0)
        graph.add_arc(consumer_node[consumer], extra, 1, 0)
    graph.add_arc(extra, sink, remainder, 0)
    # Warm start: queues staying with an owner in their zone, up to its floor, cost nothing,
    # and a flow on cost-0 arcs is optimal for its value; the solver routes the rest.
    for index, ((zone, _), members) in enumerate(classes.items()):
        left = len(members)
        for owner, arc in owner_arcs[index]:
            amount = min(left, graph.residual(floor_arcs[owner]))
            if amount and consumer_zone(owner) == zone:
                graph.push([source_arcs[index], arc, floor_arcs[owner]], amount)
                left -= amount
    flow, _ = graph.solve(source, sink)
    assert flow == total, "balanced capacities always admit every queue"

    rank = {mq: index for index, mq in enumerate(queues)}
    shares: Shares = {consumer: [] for consumer in consumers}
    pooled: dict[str, list[MessageQueue]] = {zone: [] for zone in pool_zones}
    for index, ((zone, _), members) in enumerate(classes.items()):
        position = 0
        for owner, arc in owner_arcs[index]:
            count = graph.flow_on(arc)
            shares[owner].extend(members[position : position + count])
            position += count
        pooled[zone].extend(members[position:])
    for zone in pool_zones:
        waiting = sorted(pooled[zone], key=rank.__getitem__)
        position = 0
        for consumer, arc in served[zone]:
            count = graph.flow_on(arc)
            shares[consumer].extend(waiting[position : position + count])
            position += count
    return shares


def max_kept(queues: Sequence[MessageQueue], consumers: Sequence[str], previous: Assignment | None) -> int:
    """The most current queues any balanced assignment leaves with a previous holder."""
    shares = allocate_sticky(queues, consumers, previous=previous)
    holders = previous_holders(previous, consumers)
    return sum(1 for consumer, share in shares.items() for mq in share if consumer in holders.get(mq, ()))
