"""Release acknowledgements: how a consumer tells the operator it let go of revoked queues.

A group with a handover mode other than ``Off`` has a second ConfigMap, ``<group>-releases``,
created and owned by the operator. Each pod's sidecar writes one key, the pod's name, when
the pod's application says it holds no queue outside a generation's share for it any more
(``POST /v1/release``); the value is a small JSON object:

    {"generation": 12}               # holds nothing outside generation 12's share
    {"generation": 12, "all": true}  # holds nothing at all, and will take nothing (shutting down)
    {"generation": 12, "all": true, "absent": true}  # as "all", written by the sidecar itself: the
                                     # application's connection closed (it crashed or stopped)

An acknowledgement of generation N releases every queue revoked from the pod in N or before;
with ``all``, also those revoked in N + 1 (they were the pod's share of N, which it let go of: a
shutting-down application races the revocation its pod's termination causes).
``all`` of the latest generation lets the pod's queues go to their new owners without a
revocation first (a clean shutdown hands over in one step); it covers nothing granted after
it, so an application that restarts and takes queues again must acknowledge anew (it should
acknowledge the generation it first reads anyway: it then holds nothing).

``absent`` is the sidecar's own word, not the application's (handover Release only): every
application of the pod that named its RocketMQ client (``?client=``) closed its connections to the
sidecar, as a broker notices a consumer's closed channel. The sidecar serves the pod nothing more
of generation N (nor of any later one while the application stays away), so the operator takes the
pod out of the group at once and gives its queues on in one step; an ``absent`` older than the
latest generation is stale, and the sidecar tells it again with each generation while it lasts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqbalance.json_limits import loads


def releases_configmap_name(group_resource: str) -> str:
    """Name of the ConfigMap that holds a ConsumerGroup's release acknowledgements."""
    return f"{group_resource}-releases"


@dataclass(frozen=True)
class Ack:
    generation: int
    all: bool = False
    """The pod holds nothing and will take nothing: everything revoked from it is released."""
    absent: bool = False
    """The pod's application is gone (its connections to the sidecar closed): not a member while
    this is the latest generation's acknowledgement."""

    def encode(self) -> str:
        data: dict[str, Any] = {"generation": self.generation}
        if self.all:
            data["all"] = True
        if self.absent:
            data["absent"] = True
        return json.dumps(data, separators=(",", ":"))


def decode_acks(data: Mapping[str, Any] | None) -> dict[str, Ack]:
    """The acknowledgements of a releases ConfigMap's data; unreadable entries are left out."""
    acks: dict[str, Ack] = {}
    for pod, text in (data or {}).items():
        try:
            value = loads(text)
            generation = value["generation"]
        except (TypeError, ValueError, KeyError):
            continue
        if isinstance(generation, int) and not isinstance(generation, bool) and generation >= 0:
            absent = value.get("absent") is True
            acks[str(pod)] = Ack(generation, value.get("all") is True or absent, absent)
    return acks
