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

**A group of several topics** is balanced per topic *and* in total: every topic's loads
differ by at most one, and so do the members' loads over all topics. Balancing each topic
alone would hand every topic's extra queue to the same first members (RocketMQ's own
tilt, apache/rocketmq#1945: three topics of 5 queues over 2 members load them 9 and 6).
Topic t has ``r_t = Q_t % C`` extra slots; over all topics ``R = sum r_t`` of them, and
total balance means every member takes ``R // C`` or ``R // C + 1``, which is always
possible (deal the extras out in turn, topic after topic). Which member takes which
topic's extra slot is then the only choice, and with one previous holder per queue and
no zones a member gains exactly one kept queue from topic t's extra slot when it held
more than ``Q_t // C`` of t's queues. ``_choose_extras`` picks the slots with the most
gains by a small flow (topics x members); the greedy above then places each topic.
Otherwise the transport network gets a node per (member, topic): its arcs to the sink
carry the topic's floor, and its extra slot goes through the member's extras node

    (member, topic) -> extras of member   capacity 1
    extras of member -> sink              capacity R // C, then 1 more at a cost that
                                          outweighs everything else (only R % C use it)

so the cheapest flow fills every lower bound and keeps both balances exactly.
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
    """Queues and consumers must be sorted and free of duplicates (the package does that).

    ``queues`` may hold several topics: each topic is balanced, and so is the total.
    """
    if not consumers:
        return {}
    holders = previous_holders(previous, consumers)
    single_owner = all(len(owners) == 1 for owners in holders.values())
    if zone_affinity:
        zone_set = {zones.of_broker(broker) for broker in {mq.broker_name for mq in queues}}
        zone_set.update(zones.of_consumer(c) for c in consumers)
        zone_affinity = len(zone_set) > 1  # one zone: every placement is in-zone
    topics = by_topic(queues)
    if single_owner and not zone_affinity:
        if len(topics) == 1:
            return _greedy(queues, consumers, holders)
        extras = _choose_extras(topics, consumers, holders)
        shares: Shares = {consumer: [] for consumer in consumers}
        for topic, topic_queues in topics.items():
            for consumer, share in _greedy(topic_queues, consumers, holders, extras[topic]).items():
                shares[consumer].extend(share)
        return shares
    if single_owner and len(topics) == 1:
        return allocate_zone_sticky(queues, consumers, holders, zones)
    return allocate_transport(queues, consumers, holders, zones, zone_affinity)


def by_topic(queues: Sequence[MessageQueue]) -> dict[str, list[MessageQueue]]:
    """The queues of each topic, in the order given (sorted queues give topics in Java order)."""
    topics: dict[str, list[MessageQueue]] = {}
    for mq in queues:
        topics.setdefault(mq.topic, []).append(mq)
    return topics


def _greedy(
    queues: Sequence[MessageQueue],
    consumers: Sequence[str],
    holders: Mapping[MessageQueue, list[str]],
    with_extra: set[int] | None = None,
) -> Shares:
    """One topic; ``with_extra``: indexes of the consumers given the extra slots (default: the best)."""
    kept: dict[str, list[MessageQueue]] = {consumer: [] for consumer in consumers}
    for mq in queues:
        owners = holders.get(mq)
        if owners:
            kept[owners[0]].append(mq)
    base, extra = divmod(len(queues), len(consumers))
    if with_extra is None:
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


def _choose_extras(
    topics: Mapping[str, Sequence[MessageQueue]],
    consumers: Sequence[str],
    holders: Mapping[MessageQueue, list[str]],
) -> dict[str, set[int]]:
    """Topic -> indexes of the consumers that take its extra slots: every consumer takes
    ``R // C`` or ``R // C + 1`` of them, and as many as possible go where they keep a queue.

    Ties fall to dealing in turn (topic after topic, each starting where the last stopped),
    which is also the answer with no previous assignment.
    """
    count = len(consumers)
    position = {consumer: index for index, consumer in enumerate(consumers)}
    extras = {topic: len(qs) % count for topic, qs in topics.items()}
    total = sum(extras.values())
    low, above = divmod(total, count)
    chosen: dict[str, set[int]] = {topic: set() for topic in topics}
    if not total:
        return chosen
    tie = total * count  # outweighs the sum of every tie-breaking cost
    over = total * (tie + count) + 1  # outweighs everything: only `above` members go past `low`
    source, sink = 0, 1
    graph = MinCostFlow(2 + count + len(topics))
    arcs: list[tuple[str, int, int]] = []
    start = 0
    for t, (topic, topic_queues) in enumerate(topics.items()):
        node = 2 + count + t
        graph.add_arc(source, node, extras[topic], 0)
        held = [0] * count
        for mq in topic_queues:
            owners = holders.get(mq)
            if owners:
                held[position[owners[0]]] += 1
        base = len(topic_queues) // count
        for index in range(count):
            gain = held[index] > base
            cost = (0 if gain else tie) + (index - start) % count
            arcs.append((topic, index, graph.add_arc(node, 2 + index, 1, cost)))
        start = (start + extras[topic]) % count
    for index in range(count):
        if low:
            graph.add_arc(2 + index, sink, low, 0)
        if above:
            graph.add_arc(2 + index, sink, 1, over)
    flow, _ = graph.solve(source, sink)
    assert flow == total, "dealing in turn always places every extra slot"
    for topic, index, arc in arcs:
        if graph.flow_on(arc):
            chosen[topic].add(index)
    return chosen


def allocate_transport(
    queues: Sequence[MessageQueue],
    consumers: Sequence[str],
    holders: Mapping[MessageQueue, list[str]],
    zones: Zones,
    zone_affinity: bool,
) -> Shares:
    """The exact solver for any previous assignment and any number of topics (the reference
    for ``sticky_zones`` and ``_choose_extras``)."""

    def queue_zone(mq: MessageQueue) -> str:
        return zones.of_broker(mq.broker_name) if zone_affinity else ""

    def consumer_zone(consumer: str) -> str:
        return zones.of_consumer(consumer) if zone_affinity else ""

    topics = by_topic(queues)
    # Classes of interchangeable queues (topic, zone, previous holders), in order of their first queue.
    classes: dict[tuple[str, str, tuple[str, ...]], list[MessageQueue]] = {}
    for mq in queues:
        classes.setdefault((mq.topic, queue_zone(mq), tuple(holders.get(mq, ()))), []).append(mq)
    pools = sorted({(topic, zone) for topic, zone, _ in classes})

    count = len(consumers)
    total = len(queues)
    cross = total + 1  # outweighs any number of moves
    extras = sum(len(qs) % count for qs in topics.values())
    low, above = divmod(extras, count)
    over = total * (cross + 1) + 1  # outweighs every other cost: only `above` members pass `low`

    source, sink, collector = 0, 1, 2
    node = 3
    pool_node = {}
    for key in pools:
        pool_node[key] = node
        node += 1
    member_node: dict[tuple[str, str], int] = {}
    for consumer in consumers:
        for topic in topics:
            member_node[(consumer, topic)] = node
            node += 1
    extras_node = {consumer: node + i for i, consumer in enumerate(consumers)}
    node += count
    class_base = node
    graph = MinCostFlow(class_base + len(classes))

    owner_arcs: list[list[tuple[str, int]]] = []
    source_arcs: list[int] = []
    for index, ((topic, zone, owners), members) in enumerate(classes.items()):
        class_node = class_base + index
        source_arcs.append(graph.add_arc(source, class_node, len(members), 0))
        owner_arcs.append(
            [
                (
                    o,
                    graph.add_arc(
                        class_node, member_node[(o, topic)], total, cross if consumer_zone(o) != zone else 0
                    ),
                )
                for o in owners
            ]
        )
        moves = 1 if owners else 0  # the queue had an owner in the group, so leaving it is a move
        graph.add_arc(class_node, pool_node[(topic, zone)], total, moves)
    served: dict[tuple[str, str], list[tuple[str, int]]] = {key: [] for key in pools}
    for topic, zone in pools:
        for consumer in consumers:
            cost = cross if consumer_zone(consumer) != zone else 0
            arc = graph.add_arc(pool_node[(topic, zone)], member_node[(consumer, topic)], total, cost)
            served[(topic, zone)].append((consumer, arc))
    floor_arcs: dict[tuple[str, str], int] = {}
    for topic, topic_queues in topics.items():
        base = len(topic_queues) // count
        for consumer in consumers:
            key = (consumer, topic)
            floor_arcs[key] = graph.add_arc(member_node[key], sink, base, 0)
            # One topic: its extra slots go to any `extras` members. Several: through the
            # member's extras node, which keeps the members' totals balanced too.
            graph.add_arc(member_node[key], collector if len(topics) == 1 else extras_node[consumer], 1, 0)
    if len(topics) == 1:
        graph.add_arc(collector, sink, extras, 0)
    else:
        for consumer in consumers:
            if low:
                graph.add_arc(extras_node[consumer], sink, low, 0)
            if above:
                graph.add_arc(extras_node[consumer], sink, 1, over)
    # Warm start: queues staying with an owner in their zone, up to its floor, cost nothing,
    # and a flow on cost-0 arcs is optimal for its value; the solver routes the rest.
    for index, ((topic, zone, _), members) in enumerate(classes.items()):
        left = len(members)
        for owner, arc in owner_arcs[index]:
            amount = min(left, graph.residual(floor_arcs[(owner, topic)]))
            if amount and consumer_zone(owner) == zone:
                graph.push([source_arcs[index], arc, floor_arcs[(owner, topic)]], amount)
                left -= amount
    flow, _ = graph.solve(source, sink)
    assert flow == total, "balanced capacities always admit every queue"

    rank = {mq: index for index, mq in enumerate(queues)}
    shares: Shares = {consumer: [] for consumer in consumers}
    pooled: dict[tuple[str, str], list[MessageQueue]] = {key: [] for key in pools}
    for index, ((topic, zone, _), members) in enumerate(classes.items()):
        position = 0
        for owner, arc in owner_arcs[index]:
            flowing = graph.flow_on(arc)
            shares[owner].extend(members[position : position + flowing])
            position += flowing
        pooled[(topic, zone)].extend(members[position:])
    for key in pools:
        waiting = sorted(pooled[key], key=rank.__getitem__)
        position = 0
        for consumer, arc in served[key]:
            flowing = graph.flow_on(arc)
            shares[consumer].extend(waiting[position : position + flowing])
            position += flowing
    return shares


def max_kept(queues: Sequence[MessageQueue], consumers: Sequence[str], previous: Assignment | None) -> int:
    """The most current queues any balanced assignment leaves with a previous holder."""
    shares = allocate_sticky(queues, consumers, previous=previous)
    holders = previous_holders(previous, consumers)
    return sum(1 for consumer, share in shares.items() for mq in share if consumer in holders.get(mq, ()))
