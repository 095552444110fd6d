"""MACHINE_ROOM_NEARBY (AllocateMachineRoomNearby).

A zone's queues go to the consumers in that zone, shared by the inner strategy; the
queues of a zone with no consumer are shared by the inner strategy among all consumers.
The Java does this for one consumer at a time; doing it per zone for the whole group
gives every consumer the same queues.

The unknown zone (a pod whose node has no zone label, a broker given no zone) is no
machine room: RocketMQ refuses to allocate at all when its resolver names none ("Machine
room is null"), and treating "unknown" as a room of its own would let one unlabelled
node capture every queue of every zone-less broker. So queues of zone-less brokers are
shared among all consumers, like a room with no consumer, and zone-less consumers take
part only in those shares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mqbalance.model import UNKNOWN_ZONE, MessageQueue, Zones, java_string_key
from mqbalance.strategies.avg import Shares

InnerStrategy = Callable[[Sequence[MessageQueue], Sequence[str]], Shares]


class EmptyZoneError(ValueError):
    """A broker or consumer whose zone is the empty string (Java: "Machine room is null")."""


def allocate_nearby(
    queues: Sequence[MessageQueue], consumers: Sequence[str], zones: Zones, inner: InnerStrategy
) -> Shares:
    queues_by_zone: dict[str, list[MessageQueue]] = {}
    for mq in queues:
        zone = zones.of_broker(mq.broker_name)
        if not zone:
            raise EmptyZoneError(f"broker {mq.broker_name!r} has an empty zone")
        queues_by_zone.setdefault(zone, []).append(mq)
    consumers_by_zone: dict[str, list[str]] = {}
    for consumer in consumers:
        zone = zones.of_consumer(consumer)
        if not zone:
            raise EmptyZoneError(f"consumer {consumer!r} has an empty zone")
        if zone != UNKNOWN_ZONE:
            consumers_by_zone.setdefault(zone, []).append(consumer)

    shares: Shares = {consumer: [] for consumer in consumers}
    # The Java walks zones in TreeMap (String) order; results are sorted afterwards, so
    # the order only has to be deterministic.
    for zone in sorted(queues_by_zone, key=java_string_key):
        local = consumers_by_zone.get(zone)
        for consumer, share in inner(queues_by_zone[zone], local or consumers).items():
            shares[consumer].extend(share)
    return shares
