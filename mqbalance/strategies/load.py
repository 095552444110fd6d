"""STICKY with ``load``: balance measured traffic (messages/s per queue) instead of queue counts.

Inputs: the queues, the members, each queue's measured load (a queue without one counts 0),
the previous assignment, zones, the setting (:class:`~mqbalance.model.LoadBalance`) and the
hysteresis state of the last call (:class:`LoadState`). Output: the assignment and the next
state. The function is pure; whoever calls it once per sample keeps the state.

With Q queues, C members, ``mean`` the total load over C and ``hottest`` the heaviest
queue's load (no assignment has its busiest member below ``max(mean, hottest)``):

    limit  = (1 + tolerance) * max(mean, hottest)       # above it a member is too busy
    settle = (1 + tolerance / 2) * max(mean, hottest)   # where a rebalance brings it
    cap    = max(ceil(Q / C), ceil(max_queue_factor * Q / C))   most queues one member holds
    least  = floor(Q / (max_queue_factor * C))                  fewest queues one member holds

The count bounds (or zone affinity) can put ``limit`` out of reach: the hottest queue's
holder holds ``least`` queues, so carries the ``least - 1`` lightest others' load too.

1. **Repair** (every call, at once). Each queue stays with its previous holder (the first in
   member order when it had several); a member over ``cap`` sheds its lightest queues. The
   queues left over (new ones, those whose holder left, those shed) go heaviest first to
   the lightest member below ``cap`` — one in the queue's zone when ``zoneAffinity`` is set
   and the zone has such a member, and among those one below ``least`` first. A member
   still below ``least`` (one that joined) then takes the lightest queue of the busiest
   member above ``least`` (with ``zoneAffinity``, one it may take without leaving the
   queue's zone, if there is one), until it holds ``least``. With no previous assignment
   at all, STICKY's assignment is the start.
2. **Hysteresis.** If the busiest member is within ``limit``, nothing else moves and the
   streak is reset. Otherwise the streak grows; queues move for load only once it reaches
   ``samples`` (or at once when the members or the queues changed since ``previous``, when
   the operator rebalances anyway), and the streak starts over.
3. **Shedding**, to a target: ``settle``, then ``limit`` for any member that could not get
   to ``settle``. While a member is above the target (the busiest first), it gives away one
   queue: the lightest whose removal alone brings it within the target, else its heaviest,
   in either case only a queue some *receiver* takes — a member that stays within the
   target and below ``cap`` with it and, with ``zoneAffinity``, is in the queue's zone
   unless the queue already sat outside it — and the lightest receiver takes it; a member
   never sheds below ``least``. When no queue fits anywhere it swaps one of its queues for
   a lighter one of a receiver that stays within the target. A member with neither is
   left as it is. Settling below ``limit`` is the second half
   of the hysteresis: once settled, each queue's load may drift by a factor within
   ``[1 - j, 1 + j]`` with ``(1 + j) / (1 - j) <= (1 + tolerance) / (1 + tolerance / 2)``
   (j about 4% at the default tolerance 0.2) without the busiest member crossing ``limit``.
   A rebalance that ends neither within ``limit`` nor with the busiest member lighter by
   ``tolerance / 2 * max(mean, hottest)`` is dropped (nothing moves for load): where the
   limit cannot be reached, small gains would only chase noise.

What follows (each checked by ``tests/unit/test_load.py``):

- every queue is held by exactly one member, and every member holds from ``least`` to
  ``cap`` queues (``max_queue_factor`` 1 keeps counts as even as STICKY's);
- only members above the target give queues away and a receiver never ends above it, so
  a pass moves each queue at most once (a rebalance at most twice, and only queues of
  members that were above ``settle``); a member above the target sheds the fewest queues
  that bring it within the target (removing its heaviest first is the way to shed fewest,
  and the last one is the lightest that suffices) whenever receivers have the room, as
  they do when ``hottest`` is at most ``tolerance / 2 * mean`` and the cap does not bind:
  the lightest member is below the mean, so it takes any queue and stays within target;
- loads that keep the busiest member within ``limit`` move nothing, and an excursion above
  it shorter than ``samples`` samples moves nothing;
- zone affinity: a load move never takes a queue out of its broker's zone, and repair
  places a queue in its zone whenever the zone has a member with room;
- the same inputs give the same output, whatever their order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mqbalance.model import (
    Assignment,
    LoadBalance,
    MessageQueue,
    Zones,
    sort_consumers,
    sort_queues,
)
from mqbalance.strategies.sticky import NO_ZONES, allocate_sticky, previous_holders

Loads = Mapping[MessageQueue, float]
"""Measured load of each queue, e.g. messages per second."""


@dataclass(frozen=True, slots=True)
class LoadState:
    """What the load-aware strategy remembers between samples (kept by its caller)."""

    over: int = 0
    """Consecutive samples, up to the last one, in which the busiest member was above the limit
    and nothing moved for load."""


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    assignment: dict[str, tuple[MessageQueue, ...]]
    """Every member is a key; its queues in RocketMQ's order."""
    state: LoadState
    """To pass to the next call."""
    limit: float
    """``(1 + tolerance) * max(mean, hottest)``."""
    settle: float
    """``(1 + tolerance / 2) * max(mean, hottest)``: where a rebalance aims."""
    cap: int
    """The most queues any member may hold."""
    least: int
    """The fewest queues any member holds."""
    load_moves: int
    """Queues moved to balance load (not counting repair)."""


def queue_cap(queues: int, members: int, settings: LoadBalance) -> int:
    """The most queues one member may hold: ``max(ceil(Q / C), ceil(max_queue_factor * Q / C))``."""
    if members <= 0:
        return 0
    even = -(-queues // members)
    return max(even, math.ceil(settings.max_queue_factor * queues / members - 1e-9))


def queue_floor(queues: int, members: int, settings: LoadBalance) -> int:
    """The fewest queues one member holds: ``floor(Q / (max_queue_factor * C))``."""
    if members <= 0:
        return 0
    return min(queues // members, math.floor(queues / (settings.max_queue_factor * members) + 1e-9))


def load_limit(loads: Iterable[float], members: int, settings: LoadBalance, *, settle: bool = False) -> float:
    """``(1 + tolerance) * max(mean, hottest)`` over the given queue loads; with ``settle``,
    ``(1 + tolerance / 2) * max(mean, hottest)``, the level a rebalance aims for."""
    values = list(loads)
    if members <= 0 or not values:
        return 0.0
    tolerance = settings.tolerance / 2 if settle else settings.tolerance
    return (1 + tolerance) * max(sum(values) / members, max(values))


def member_loads(assignment: Assignment, loads: Loads) -> dict[str, float]:
    """Each member's load: the sum of its queues' loads."""
    return {member: sum(loads.get(mq, 0.0) for mq in share) for member, share in assignment.items()}


def balance_load(
    queues: Iterable[MessageQueue],
    consumers: Iterable[str],
    *,
    loads: Loads,
    previous: Assignment | None = None,
    zones: Zones = NO_ZONES,
    zone_affinity: bool = False,
    settings: LoadBalance | None = None,
    state: LoadState | None = None,
) -> LoadOutcome:
    """One sample: the assignment and the state to keep for the next sample (see the module)."""
    settings = settings or LoadBalance()
    state = state or LoadState()
    ordered = sort_queues(queues)
    members = sort_consumers(consumers)
    weight = {mq: _load(loads, mq) for mq in ordered}
    if not members:
        return LoadOutcome({}, LoadState(), 0.0, 0.0, 0, 0, 0)
    index = {member: i for i, member in enumerate(members)}
    rank = {mq: i for i, mq in enumerate(ordered)}
    cap = queue_cap(len(ordered), len(members), settings)
    least = queue_floor(len(ordered), len(members), settings)
    limit = load_limit(weight.values(), len(members), settings)
    slack = 1e-9 * max(1.0, limit)

    def queue_zone(mq: MessageQueue) -> str:
        return zones.of_broker(mq.broker_name)

    def member_zone(member: str) -> str:
        return zones.of_consumer(member)

    held: dict[str, list[MessageQueue]] = {member: [] for member in members}
    load = dict.fromkeys(members, 0.0)
    pending: list[MessageQueue] = []
    if not previous or not any(previous.get(member) for member in members):
        start = allocate_sticky(ordered, members, zones=zones, zone_affinity=zone_affinity)
        for member, share in start.items():
            held[member] = list(share)
        changed = True
    else:
        holders = previous_holders(previous, members)
        for mq in ordered:
            owners = holders.get(mq)
            if owners:
                held[owners[0]].append(mq)
            else:
                pending.append(mq)
        before = {mq for share in previous.values() for mq in share}
        changed = set(previous) != set(members) or before != set(ordered)
    for member in members:
        share = held[member]
        if len(share) > cap:
            # Shed the lightest (the last in queue order among equals) down to the cap.
            share.sort(key=lambda mq: (weight[mq], -rank[mq]))
            pending.extend(share[: len(share) - cap])
            del share[: len(share) - cap]
        load[member] = sum(weight[mq] for mq in share)

    pending.sort(key=lambda mq: (-weight[mq], rank[mq]))
    for mq in pending:
        room = [m for m in members if len(held[m]) < cap]
        if zone_affinity:
            local = [m for m in room if member_zone(m) == queue_zone(mq)]
            room = local or room
        target = min(room, key=lambda m: (len(held[m]) >= least, load[m], len(held[m]), index[m]))
        held[target].append(mq)
        load[target] += weight[mq]
    for taker in members:
        while len(held[taker]) < least:
            _take_one(taker, members, held, load, weight, rank, index, least, zone_affinity, zones)

    settle = load_limit(weight.values(), len(members), settings, settle=True)
    moves = 0
    if max(load.values()) <= limit + slack:
        next_state = LoadState()
    elif changed or state.over + 1 >= settings.samples:
        repaired = {member: list(share) for member, share in held.items()}
        was = max(load.values())
        shed = _Shedding(members, held, load, weight, rank, index, cap, least, slack, zone_affinity, zones)
        for level in (settle, limit):  # to ``settle`` where receivers have room, else to ``limit``
            shed.run(level)
        now = max(load.values())
        if now > limit + slack and was - now < (settle - limit / (1 + settings.tolerance)) - slack:
            held = repaired  # neither within the limit nor half the tolerance better: chasing noise
        owner = {mq: member for member, share in repaired.items() for mq in share}
        moves = sum(1 for member in members for mq in held[member] if owner[mq] != member)
        next_state = LoadState()
    else:
        next_state = LoadState(over=state.over + 1)
    assignment = {member: tuple(sorted(held[member], key=rank.__getitem__)) for member in members}
    return LoadOutcome(assignment, next_state, limit, settle, cap, least, moves)


def _take_one(
    taker: str,
    members: Sequence[str],
    held: dict[str, list[MessageQueue]],
    load: dict[str, float],
    weight: Mapping[MessageQueue, float],
    rank: Mapping[MessageQueue, int],
    index: Mapping[str, int],
    least: int,
    zone_affinity: bool,
    zones: Zones,
) -> None:
    """``taker`` takes the lightest queue of the busiest member above ``least`` (one it may take
    without leaving the queue's zone, if any member has one)."""

    def allowed(mq: MessageQueue, donor: str) -> bool:
        zone = zones.of_broker(mq.broker_name)
        return not zone_affinity or zones.of_consumer(donor) != zone or zones.of_consumer(taker) == zone

    offers = [(donor, mq) for donor in members if len(held[donor]) > least for mq in held[donor]]
    offers = [offer for offer in offers if allowed(offer[1], offer[0])] or offers
    donor, mq = min(offers, key=lambda o: (-load[o[0]], index[o[0]], weight[o[1]], rank[o[1]]))
    held[donor].remove(mq)
    held[taker].append(mq)
    load[donor] -= weight[mq]
    load[taker] += weight[mq]


def _load(loads: Loads, mq: MessageQueue) -> float:
    value = loads.get(mq, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"the load of {mq} must be a finite number of 0 or more, got {value!r}")
    return float(value)


@dataclass
class _Shedding:
    """Moves queues off the members above a target (the module's step 3)."""

    members: Sequence[str]
    held: dict[str, list[MessageQueue]]
    load: dict[str, float]
    weight: Mapping[MessageQueue, float]
    rank: Mapping[MessageQueue, int]
    index: Mapping[str, int]
    cap: int
    least: int
    slack: float
    zone_affinity: bool
    zones: Zones

    def may_take(self, member: str, mq: MessageQueue, holder: str) -> bool:
        """Whether ``member`` may take ``mq`` from ``holder`` without leaving the queue's zone."""
        if not self.zone_affinity:
            return True
        zone = self.zones.of_broker(mq.broker_name)
        return self.zones.of_consumer(holder) != zone or self.zones.of_consumer(member) == zone

    def move(self, mq: MessageQueue, source: str, target: str) -> None:
        self.held[source].remove(mq)
        self.held[target].append(mq)
        self.load[source] -= self.weight[mq]
        self.load[target] += self.weight[mq]

    def run(self, target: float) -> None:
        weight, load, held = self.weight, self.load, self.held
        stuck: set[str] = set()
        while True:
            over = [m for m in self.members if load[m] > target + self.slack and m not in stuck]
            if not over:
                return
            source = max(over, key=lambda m: (load[m], -self.index[m]))
            excess = load[source] - target
            share = sorted(held[source], key=lambda mq: (-weight[mq], self.rank[mq]))
            # The lightest single queue that is enough, then the rest heaviest first.
            enough = [mq for mq in share if weight[mq] >= excess - self.slack]
            first = [min(enough, key=lambda mq: (weight[mq], self.rank[mq]))] if enough else []
            if not (
                self.shed_one(source, first + [mq for mq in share if mq not in first], target)
                or self.swap_one(source, share, target)
            ):
                stuck.add(source)

    def receivers(self, source: str, mq: MessageQueue, target: float, extra: float = 0.0) -> list[str]:
        return [
            m
            for m in self.members
            if m != source
            and self.load[m] + self.weight[mq] - extra <= target + self.slack
            and self.may_take(m, mq, source)
        ]

    def lightest(self, candidates: Iterable[str]) -> str:
        return min(candidates, key=lambda m: (self.load[m], len(self.held[m]), self.index[m]))

    def shed_one(self, source: str, order: Sequence[MessageQueue], target: float) -> bool:
        if len(self.held[source]) <= self.least:
            return False
        for mq in order:
            if self.weight[mq] <= 0:
                return False
            room = [m for m in self.receivers(source, mq, target) if len(self.held[m]) < self.cap]
            if room:
                self.move(mq, source, self.lightest(room))
                return True
        return False

    def swap_one(self, source: str, share: Sequence[MessageQueue], target: float) -> bool:
        """When no queue fits anywhere: exchange one of the source's queues for a lighter one of
        a receiver that stays within ``target``, the receiver's lightest queue first."""
        for mq in share:
            for member in sorted(
                self.receivers(source, mq, target, self.weight[mq]), key=self.load.__getitem__
            ):
                lighter = sorted(
                    (p for p in self.held[member] if self.weight[p] < self.weight[mq] - self.slack),
                    key=lambda p: (self.weight[p], self.rank[p]),
                )
                for back in lighter:
                    fits = self.load[member] - self.weight[back] + self.weight[mq] <= target + self.slack
                    if fits and self.may_take(source, back, member):
                        self.move(mq, source, member)
                        self.move(back, member, source)
                        return True
        return False
