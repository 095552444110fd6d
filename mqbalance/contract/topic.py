"""A Topic resource as a route: the one reader, used by the operator and the sidecar alike.

A Topic's route comes from one of two places. Written by hand, ``spec.brokers`` lists every
broker with its queue counts. Read from RocketMQ, ``spec.nameServer`` is set: the operator
asks the NameServer and writes what it answered into ``status.route`` (the last good route,
kept while the NameServer cannot be reached), and ``spec.brokers`` only adds zones.

The CRD schema rejects most bad input at admission (and on current Kubernetes its CEL rules
more); this reader still checks everything, because objects written before a rule existed,
or through a 1.20 API server without CEL, reach it too. That includes the bounds on a route
(:mod:`mqbalance.contract.bounds`), checked from the queue numbers before any queue is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mqbalance.contract.bounds import check_route
from mqbalance.contract.errors import SpecError
from mqbalance.model import PERM_READ_WRITE, UNKNOWN_ZONE, Broker, TopicRoute


class RouteNotRead(SpecError):
    """A Topic reads its route from a NameServer, and none has been read yet."""


@dataclass(frozen=True, slots=True)
class BrokerEntry:
    """One ``spec.brokers`` entry; the counts are None where the spec leaves them out."""

    name: str
    zone: str
    read_queue_nums: int | None
    write_queue_nums: int | None
    perm: int


DEFAULT_POLL_SECONDS = 30.0
"""How often a NameServer route is read again: the Java client's pollNameServerInterval."""
MAX_POLL_SECONDS = 3600
"""The schema's maximum of ``pollSeconds``."""


@dataclass(frozen=True, slots=True)
class NameServerSpec:
    """``spec.nameServer``: where a Topic's route is read from, and how often."""

    addresses: tuple[str, ...] = ()
    """Empty: the operator's own NameServer (``--name-server``)."""
    poll_seconds: float = DEFAULT_POLL_SECONDS
    acl_secret: str | None = None
    """``aclSecretRef.name``: a Secret in the Topic's namespace whose ``accessKey`` and
    ``secretKey`` sign the operator's requests to the brokers (clusters with ACL); None: unsigned."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A Topic's spec as the operator acts on it; the route itself is :func:`read_topic`'s."""

    topic_name: str
    """The RocketMQ topic name."""
    name_server: NameServerSpec | None
    """None: the route is ``spec.brokers``, written by hand."""


def reads_name_server(spec: Mapping[str, Any] | None) -> bool:
    """Whether the Topic's route comes from a NameServer (``spec.nameServer`` is set)."""
    return isinstance(spec, Mapping) and spec.get("nameServer") is not None


def read_topic_spec(resource_name: str, spec: Mapping[str, Any] | None) -> TopicSpec:
    """The Topic's RocketMQ name and NameServer. Never raises: an unreadable address or poll
    interval is left out (the schema rejects them; :func:`read_topic` reports a bad spec)."""
    spec = spec if isinstance(spec, Mapping) else {}
    return TopicSpec(topic_name(resource_name, spec), read_name_server(spec))


def read_name_server(spec: Mapping[str, Any] | None) -> NameServerSpec | None:
    """``spec.nameServer``, None when the Topic does not name one."""
    if not reads_name_server(spec):
        return None
    assert spec is not None
    name_server = spec.get("nameServer")
    if not isinstance(name_server, Mapping):
        return NameServerSpec()
    addresses = name_server.get("addresses")
    poll = name_server.get("pollSeconds")
    secret_ref = name_server.get("aclSecretRef")
    secret = secret_ref.get("name") if isinstance(secret_ref, Mapping) else None
    return NameServerSpec(
        tuple(a for a in addresses if isinstance(a, str)) if isinstance(addresses, list) else (),
        float(poll)
        if isinstance(poll, (int, float)) and not isinstance(poll, bool) and 1 <= poll <= MAX_POLL_SECONDS
        else DEFAULT_POLL_SECONDS,
        secret if isinstance(secret, str) and secret else None,
    )


def read_topic(
    resource_name: str, spec: Mapping[str, Any] | None, route: Mapping[str, Any] | None = None
) -> TopicRoute:
    """The route of Topic ``resource_name``; broker zones left out are UNKNOWN_ZONE.

    ``route`` is the Topic's ``status.route``, used when the spec names a NameServer.
    Raises SpecError naming the field to fix, RouteNotRead when a route is still to be read,
    OverBound when the route is over a bound.
    """
    where = f"Topic {resource_name!r}"
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where} has no spec")
    entries = broker_entries(resource_name, spec)
    name = topic_name(resource_name, spec)
    if not reads_name_server(spec):
        if not entries:
            raise SpecError(
                f"{where}: spec.brokers must list at least one broker, or set spec.nameServer to read "
                "the route from RocketMQ"
            )
        for i, e in enumerate(entries):
            for key, value in (("readQueueNums", e.read_queue_nums), ("writeQueueNums", e.write_queue_nums)):
                if value is None:
                    raise SpecError(
                        f"{where}: spec.brokers[{i}].{key} is missing; give the queue counts of every "
                        "broker, or set spec.nameServer to read them from RocketMQ"
                    )
        brokers = tuple(
            Broker(e.name, e.read_queue_nums or 0, e.write_queue_nums or 0, e.perm, e.zone) for e in entries
        )
        check_route(where, brokers)
        return TopicRoute(name, brokers)
    if route is None:
        raise RouteNotRead(
            f"{where}: its route has not been read from the NameServer yet (see the Topic's "
            "RouteAvailable condition)"
        )
    read = read_route_status(resource_name, route)
    check_route(where, read)
    # A zone written in spec.brokers wins over the one the broker registered with.
    zones = {e.name: e.zone for e in entries if e.zone != UNKNOWN_ZONE}
    return TopicRoute(
        name,
        tuple(
            Broker(
                b.name,
                b.read_queue_nums,
                b.write_queue_nums,
                b.perm,
                zones.get(b.name, b.zone),
                b.has_master,
            )
            for b in read
        ),
    )


def broker_entries(resource_name: str, spec: Mapping[str, Any]) -> list[BrokerEntry]:
    """``spec.brokers``, checked; an absent list is empty."""
    where = f"Topic {resource_name!r}"
    brokers_raw = spec.get("brokers")
    if brokers_raw is None:
        return []
    if not isinstance(brokers_raw, list):
        raise SpecError(f"{where}: spec.brokers must be a list of brokers")
    entries: list[BrokerEntry] = []
    seen: set[str] = set()
    for i, b in enumerate(brokers_raw):
        at = f"{where}: spec.brokers[{i}]"
        if not isinstance(b, Mapping) or not isinstance(b.get("name"), str) or not b["name"]:
            raise SpecError(f"{at} needs a name")
        if b["name"] in seen:
            raise SpecError(f"{at}: broker {b['name']!r} is listed twice; merge the entries")
        seen.add(b["name"])
        counts: list[int | None] = []
        for key in ("readQueueNums", "writeQueueNums"):
            value = b.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise SpecError(f"{at}.{key} must be an integer of 0 or more, got {value!r}")
            counts.append(value)
        perm = b.get("perm", PERM_READ_WRITE)
        # Any PermName bit combination, as the CRD admits (7 is TBW102's read-write-inherit).
        if not isinstance(perm, int) or isinstance(perm, bool) or not 0 <= perm <= 15:
            raise SpecError(
                f"{at}.perm is {perm!r}; use PermName bits 0-15: 6 read-write, 4 read-only, 2 write-only"
            )
        zone = b.get("zone")
        if zone is not None and not isinstance(zone, str):
            raise SpecError(f"{at}.zone must be a zone name, got {zone!r}")
        entries.append(BrokerEntry(b["name"], zone or UNKNOWN_ZONE, counts[0], counts[1], perm))
    return entries


def route_status(address: str, brokers: Sequence[Broker]) -> dict[str, Any]:
    """``status.route``: the route a NameServer answered, as the operator writes it (a broker's
    ``zone`` only when it registered with one)."""
    return {
        "nameServer": address,
        "brokers": [
            {
                "name": b.name,
                "readQueueNums": b.read_queue_nums,
                "writeQueueNums": b.write_queue_nums,
                "perm": b.perm,
                "master": b.has_master,
                **({"zone": b.zone} if b.zone != UNKNOWN_ZONE else {}),
            }
            for b in sorted(brokers, key=lambda b: b.name)
        ],
    }


def read_route_status(resource_name: str, route: Mapping[str, Any]) -> list[Broker]:
    """The brokers of a ``status.route`` with the zones they registered with (else unknown);
    SpecError if it was edited into nonsense."""
    where = f"Topic {resource_name!r}: status.route"
    raw = route.get("brokers") if isinstance(route, Mapping) else None
    if not isinstance(raw, list):
        raise SpecError(f"{where} has no broker list; the operator rewrites it at its next read")
    brokers = []
    for i, b in enumerate(raw):
        try:
            brokers.append(
                Broker(
                    _text(b["name"]),
                    _count(b["readQueueNums"]),
                    _count(b["writeQueueNums"]),
                    _count(b["perm"]),
                    zone=b.get("zone") or UNKNOWN_ZONE,
                    has_master=b.get("master", True) is not False,
                )
            )
        except (KeyError, TypeError, ValueError):
            raise SpecError(f"{where}.brokers[{i}] is unreadable: {b!r}") from None
    return brokers


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(value)
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(value)
    return value


def topic_name(resource_name: str, spec: Mapping[str, Any]) -> str:
    """The RocketMQ topic name: ``spec.topicName``, or the resource name when empty."""
    name = spec.get("topicName")
    return name if isinstance(name, str) and name else resource_name
