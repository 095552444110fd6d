"""A Topic resource's spec as a route: the one reader, used by the operator and the sidecar alike.

The CRD schema rejects most bad input at admission (and on current Kubernetes its CEL rules
more); this reader still checks everything, because objects written before a rule existed,
or through a 1.20 API server without CEL, reach it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mqbalance.contract.errors import SpecError
from mqbalance.model import PERM_READ_WRITE, UNKNOWN_ZONE, Broker, TopicRoute


def read_topic(resource_name: str, spec: Mapping[str, Any] | None) -> TopicRoute:
    """The route of Topic ``resource_name``; broker zones left out are UNKNOWN_ZONE.

    Raises SpecError naming the field to fix.
    """
    where = f"Topic {resource_name!r}"
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where} has no spec")
    brokers_raw = spec.get("brokers")
    if not isinstance(brokers_raw, list) or not brokers_raw:
        raise SpecError(f"{where}: spec.brokers must list at least one broker")
    brokers: list[Broker] = []
    seen: set[str] = set()
    for i, b in enumerate(brokers_raw):
        at = f"{where}: spec.brokers[{i}]"
        if not isinstance(b, Mapping) or not isinstance(b.get("name"), str) or not b["name"]:
            raise SpecError(f"{at} needs a name")
        if b["name"] in seen:
            raise SpecError(f"{at}: broker {b['name']!r} is listed twice; merge the entries")
        seen.add(b["name"])
        counts = []
        for key in ("readQueueNums", "writeQueueNums"):
            value = b.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
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
        brokers.append(Broker(b["name"], counts[0], counts[1], perm, zone or UNKNOWN_ZONE))
    return TopicRoute(topic_name(resource_name, spec), tuple(brokers))


def topic_name(resource_name: str, spec: Mapping[str, Any]) -> str:
    """The RocketMQ topic name: ``spec.topicName``, or the resource name when empty."""
    name = spec.get("topicName")
    return name if isinstance(name, str) and name else resource_name
