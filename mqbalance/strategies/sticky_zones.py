"""STICKY with zone affinity when every queue had at most one previous holder in the group.

The exact network in ``sticky.py`` has a node per consumer and per (zone, previous owner)
class, with an arc from every zone's pool to every consumer: thousands of nodes for a
large group. Here consumers that look alike to the objective share one node, which
leaves a few dozen nodes whatever the group's size.

A consumer's *type* is its zone and, for each queue zone z, ``min(h_z, base + 1)`` where
``h_z`` counts the current queues of zone z it held before. The network, per type t of m
consumers (costs as in ``sticky.py``: ``Q + 1`` per cross-zone placement, 1 per move):

    source -> class (z, t)   capacity: the queues of zone z the consumers of t held
    class  -> t              capacity m * min(h_z, base + 1), cost (Q + 1) if z is not t's zone
    class  -> pool z         cost 1 (leaving the holder is a move)
    source -> pool z         capacity: zone z's queues nobody in the group held
    pool z -> t              cost (Q + 1) if z is not t's zone
    t -> sink                capacity m * base;  t -> extra: m;  extra -> sink: Q % C

Proof that its least cost is the least (Q + 1) * cross-zone + moves of any balanced
assignment, and that dealing an optimal flow out (``_deal``) attains it:

1. Any balanced assignment gives a flow of the same cost. For each type and zone z let
   the class -> t arc carry the queues of zone z its consumers keep: a consumer keeps at
   most min(h_z, its load) <= min(h_z, base + 1), so the arc's capacity holds. Every
   other queue goes through its zone's pool to the type of its new owner. A type's load
   is m * base plus its consumers with base + 1, at most m, and all of those add up to
   Q % C. Costs depend only on zones and on kept-or-not, so they agree.
2. Dealing a flow gives a balanced assignment of at most its cost. For a type, lay its
   L = m * base + e units (e <= m) in a row: the kept units zone by zone, then the
   pooled ones zone by zone, and deal unit j to its j % m-th consumer. Each consumer gets
   base or base + 1 units, exactly e of them base + 1, so loads are balanced overall.
   A run of K kept units of zone z gives each consumer at most ceil(K / m) <= min(h_z,
   base + 1) <= h_z of them, so each keeps that many of its own held queues of zone z;
   its other held queues join pool z with the queues nobody held, and pool units of zone
   z are queues of zone z. So cross-zone placements are exactly the flow's, and a queue
   moves only if it went class -> pool, which the flow paid for (a pooled queue dealt
   back to its holder makes the assignment cheaper, never dearer).

By 1 the network's optimum is at most the best assignment's cost, by 2 at least, so the
dealt assignment is optimal; the weight Q + 1 exceeds any number of moves, which makes
the order lexicographic: most in-zone placements first, then fewest moves. Everything is
computed from the sorted queues and consumers, so the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mqbalance.model import MessageQueue, Zones
from mqbalance.strategies.avg import Shares
from mqbalance.strategies.mincostflow import MinCostFlow

TypeKey = tuple[str, tuple[tuple[str, int], ...]]
"""A consumer's zone, and (queue zone, held count clipped to base + 1) for each zone it held."""


def allocate_zone_sticky(
    queues: Sequence[MessageQueue],
    consumers: Sequence[str],
    holders: Mapping[MessageQueue, Sequence[str]],
    zones: Zones,
) -> Shares:
    """Queues and consumers sorted and unique; ``holders``: queue -> its previous holders in the group,
    at most one each (``sticky.previous_holders``)."""
    total = len(queues)
    base, remainder = divmod(total, len(consumers))
    clip = base + 1

    broker_zone = {broker: zones.of_broker(broker) for broker in {mq.broker_name for mq in queues}}
    # Queues by (zone, previous holder or None), in order of their first queue.
    classes: dict[tuple[str, str | None], list[MessageQueue]] = {}
    for mq in queues:
        previous = holders.get(mq)
        key = (broker_zone[mq.broker_name], previous[0] if previous else None)
        group = classes.get(key)
        if group is None:
            classes[key] = [mq]
        else:
            group.append(mq)
    held: dict[str, dict[str, int]] = {consumer: {} for consumer in consumers}
    free: dict[str, int] = {}
    for (zone, owner), group in classes.items():
        if owner is None:
            free[zone] = len(group)
        else:
            held[owner][zone] = len(group)
    pool_zones = sorted(set(broker_zone.values()))

    # Consumers grouped by type, types in order of their first consumer.
    types: dict[TypeKey, list[str]] = {}
    for consumer in consumers:
        clipped = tuple(sorted((zone, min(count, clip)) for zone, count in held[consumer].items()))
        types.setdefault((zones.of_consumer(consumer), clipped), []).append(consumer)

    source, sink, extra = 0, 1, 2
    pool_node = {zone: 3 + i for i, zone in enumerate(pool_zones)}
    type_base = 3 + len(pool_zones)
    class_base = type_base + len(types)
    class_count = sum(len(clipped) for _, clipped in types)
    graph = MinCostFlow(class_base + class_count)
    cross = total + 1  # outweighs any number of moves

    for zone in pool_zones:
        if free.get(zone):
            graph.add_arc(source, pool_node[zone], free[zone], 0)
    keep_arcs: list[list[tuple[str, int]]] = []
    pool_arcs: list[list[tuple[str, int]]] = []
    class_node = class_base
    for index, ((home, clipped), members) in enumerate(types.items()):
        node = type_base + index
        floor_arc = graph.add_arc(node, sink, len(members) * base, 0)
        graph.add_arc(node, extra, len(members), 0)
        keep_arcs.append([])
        for zone, bound in clipped:
            supply = sum(held[member][zone] for member in members)
            cost = cross if zone != home else 0
            supply_arc = graph.add_arc(source, class_node, supply, 0)
            keep_arc = graph.add_arc(class_node, node, len(members) * bound, cost)
            keep_arcs[-1].append((zone, keep_arc))
            graph.add_arc(class_node, pool_node[zone], supply, 1)
            class_node += 1
            # Warm start: keeping in-zone up to the floor costs nothing, and a flow on cost-0
            # arcs is a cheapest flow of its value; the solver routes the rest.
            amount = min(supply, len(members) * bound, graph.residual(floor_arc))
            if amount and not cost:
                graph.push([supply_arc, keep_arc, floor_arc], amount)
        pool_arcs.append(
            [
                (zone, graph.add_arc(pool_node[zone], node, total, cross if zone != home else 0))
                for zone in pool_zones
            ]
        )
    graph.add_arc(extra, sink, remainder, 0)
    flow, _ = graph.solve(source, sink)
    assert flow == total, "balanced capacities always admit every queue"

    keep: dict[str, dict[str, int]] = {}
    take: dict[str, list[tuple[str, int]]] = {}
    for index, members in enumerate(types.values()):
        runs = [(zone, graph.flow_on(arc)) for zone, arc in keep_arcs[index]]
        pooled = [(zone, graph.flow_on(arc)) for zone, arc in pool_arcs[index]]
        dealt = _deal(len(members), [count for _, count in runs + pooled])
        for member, units in zip(members, dealt, strict=True):
            kept, taken = units[: len(runs)], units[len(runs) :]
            keep[member] = {zone: n for (zone, _), n in zip(runs, kept, strict=True) if n}
            take[member] = [(zone, n) for (zone, _), n in zip(pooled, taken, strict=True) if n]

    shares: Shares = {consumer: [] for consumer in consumers}
    pools: dict[str, list[MessageQueue]] = {zone: [] for zone in pool_zones}
    for (zone, owner), group in classes.items():
        count = keep[owner].get(zone, 0) if owner is not None else 0
        if owner is not None and count:
            shares[owner].extend(group[:count])
        pools[zone].extend(group[count:])
    position = dict.fromkeys(pool_zones, 0)
    for consumer in consumers:
        share = shares[consumer]
        for zone, count in take[consumer]:
            start = position[zone]
            share.extend(pools[zone][start : start + count])
            position[zone] = start + count
    return shares


def _deal(members: int, runs: Sequence[int]) -> list[list[int]]:
    """Units laid out run after run, unit j to member j % members: each member's count per run."""
    dealt: list[list[int]] = [[] for _ in range(members)]
    start = 0
    for run in runs:
        end = start + run
        for index, counts in enumerate(dealt):
            # Units j in [0, n) with j % members == index: (n - index + members - 1) // members.
            counts.append((end - index + members - 1) // members - (start - index + members - 1) // members)
        start = end
    return dealt
