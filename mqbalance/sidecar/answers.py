"""What the sidecar answers, encoded before anyone asks: a pod's share of a document, a route,
a queue selection.

Pure: documents and routes in, JSON values and bytes out. Each new assignment is encoded once
on arrival (:class:`Served`), each route once per change (:class:`RouteEntry`), so serving is a
dictionary lookup and a write of ready bytes however many requests follow.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mqbalance.contract import AssignmentDocument, HandoverMode
from mqbalance.model import MessageQueue, TopicRoute


def dumps(data: Any) -> bytes:
    """Compact JSON, as every prepared answer is encoded."""
    return json.dumps(data, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Served:
    """One group's assignment as served, with its responses encoded in advance."""

    document: AssignmentDocument
    received_at: float
    queues_body: bytes
    """``GET /v1/queues``: this pod's queues."""
    assignment_body: bytes
    """``GET /v1/assignment``: the whole document."""
    fenced_body: bytes = b""
    """``GET /v1/queues`` while fenced (documents with lease terms only): no queues."""
    absent_body: bytes = b""
    """``GET /v1/queues`` after the pod's application went away (handover Release): no queues."""

    @property
    def generation(self) -> int:
        return self.document.generation


def member_view(resource: str, member: str, doc: AssignmentDocument, received_at: float) -> dict[str, Any]:
    """This pod's share of ``doc``: the body of ``GET /v1/queues``."""
    queues = doc.queues_of(member)
    view = {
        "group": doc.group,
        "groupResource": resource,
        "member": member,
        "isMember": member in doc.members,
        "zone": doc.members.get(member),
        "generation": doc.generation,
        "strategy": doc.strategy,
        "messageModel": doc.message_model.value,
        "computedAt": doc.computed_at,
        "receivedAt": received_at,
        "reason": doc.reason,
        "queueCount": sum(len(q) for q in queues.values()),
        "queues": {
            topic: [{"brokerName": mq.broker_name, "queueId": mq.queue_id} for mq in topic_queues]
            for topic, topic_queues in sorted(queues.items())
        },
    }
    if doc.handover is not HandoverMode.OFF:
        view["handover"] = doc.handover.value
        # Revoked from this pod and held by nobody until it releases them: stop fetching them, commit
        # their offsets, then POST /v1/release.
        view["releasing"] = [
            {"generation": r.generation, "queues": _queue_lists(r.queues)} for r in doc.releasing_of(member)
        ]
    return view


def fenced_view(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` (a :func:`member_view`) while fenced: no queues, and why."""
    return {
        **view,
        "queueCount": 0,
        "queues": {topic: [] for topic in view["queues"]},
        "fenced": True,
        "grant": {"validForMs": 0},
    }


def absent_view(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` (a :func:`member_view`) once the pod's application went away (``presence.py``): no
    queues of this generation, whoever asks."""
    return {**fenced_view(view), "absent": True}


def _queue_lists(queues: Iterable[MessageQueue]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for mq in queues:
        out.setdefault(mq.topic, []).append({"brokerName": mq.broker_name, "queueId": mq.queue_id})
    return out


def select_answer(mq: MessageQueue) -> bytes:
    """The body of ``POST /v1/topics/{topic}/select`` that names ``mq``."""
    return dumps({"topic": mq.topic, "broker": mq.broker_name, "queueId": mq.queue_id})


@dataclass(frozen=True, slots=True)
class RouteEntry:
    """A Topic resource's route with what selection needs from it, computed once per route.

    Routes change rarely and selections come by the thousand: the writable queues
    (empty when there is none; the producer then raises its error) and the encoded
    answer naming each of them are ready before the first request.
    """

    resource: str
    route: TopicRoute
    queues: tuple[MessageQueue, ...]
    answers: dict[MessageQueue, bytes]

    @classmethod
    def of(cls, resource: str, route: TopicRoute) -> RouteEntry:
        queues = tuple(route.writable_queues())
        return cls(resource, route, queues, {mq: select_answer(mq) for mq in queues})

    def answer(self, mq: MessageQueue) -> bytes:
        found = self.answers.get(mq)
        return found if found is not None else select_answer(mq)


def route_json(resource: str, route: TopicRoute) -> dict[str, Any]:
    return {
        "topic": route.topic,
        "resource": resource,
        "brokers": [
            {
                "name": b.name,
                "zone": b.zone,
                "readQueueNums": b.read_queue_nums,
                "writeQueueNums": b.write_queue_nums,
                "perm": b.perm,
                "master": b.has_master,
            }
            for b in route.brokers
        ],
        "readableQueues": len(route.readable_queues()),
        "writableQueues": len(route.writable_queues()),
    }
