"""The assignment document: what the operator publishes and every sidecar serves.

It is stored as JSON under ``assignment.json`` in ConfigMap ``<group>-assignment``.
Queues are grouped as ``{member: {broker: [queueId, ...]}}`` per topic, which stays
compact for thousands of queues (about 3 bytes a queue).

    {
      "group": "orders-consumer", "generation": 7, "strategy": "STICKY",
      "messageModel": "CLUSTERING", "computedAt": 1795400000.123, "reason": "member-joined",
      "members": {"orders-7f9c-abcde": "zone-a"},
      "brokerZones": {"broker-a": "zone-a"},
      "topics": {"orders": {"orders-7f9c-abcde": {"broker-a": [0, 1, 2]}}}
    }

With a handover mode other than ``Off`` (see ``handover.py``) a generation may also hold
queues revoked from their old owner and held by nobody until that owner releases them:

      "handover": "Release",
      "releasing": [{"owner": "orders-7f9c-fghij", "generation": 7, "since": 1795400000.1,
                     "topics": {"orders": {"broker-a": [3]}}}]

Both keys are left out when empty, so a document without a handover reads and encodes as
it always did. Such a document also says how long a member's grant lasts (``seconds``) without
a Lease renewal that reached the API server, and how often its sidecar renews (see
``docs/reliability.md``, "Time-bounded ownership"):

      "lease": {"seconds": 20, "renewSeconds": 5}

Absent (older operators, mode Off): no lease, the sidecar serves its queues without a grant.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mqbalance.contract.handover import HandoverMode
from mqbalance.json_limits import JsonError, loads
from mqbalance.model import Assignment, MessageModel, MessageQueue, sort_queues

CONFIGMAP_KEY = "assignment.json"
"""The ConfigMap data key that holds the document."""

QueueMap = dict[str, dict[str, list[int]]]
"""member -> broker -> queue ids: the compact JSON form of one topic's assignment."""


class DocumentError(ValueError):
    """An assignment document that cannot be read."""


def load_json(text: str, what: str) -> Any:
    """``text`` parsed as JSON; a DocumentError that names ``what`` if it is not (or is nested
    deeper than any document: :data:`~mqbalance.json_limits.MAX_DEPTH`)."""
    try:
        return loads(text)
    except JsonError as e:
        raise DocumentError(f"{what} is not JSON: {e}") from None


@contextmanager
def reading(what: str, *also: type[Exception]) -> Iterator[None]:
    """Turn what goes wrong while reading ``what`` out of parsed JSON into one DocumentError: a
    missing field by its name, a value of the wrong type (or one of ``also``) as malformed."""
    malformed: tuple[type[Exception], ...] = (TypeError, ValueError, OverflowError, *also)
    try:
        yield
    except DocumentError:
        raise
    except KeyError as e:
        raise DocumentError(f"{what} lacks field {e.args[0]!r}") from None
    except malformed as e:
        raise DocumentError(f"malformed {what}: {e}") from None


def configmap_name(group_resource: str) -> str:
    """Name of the ConfigMap that holds a ConsumerGroup's assignment."""
    return f"{group_resource}-assignment"


def encode_queue_map(assignment: Assignment) -> QueueMap:
    """One topic's assignment in compact form; every member is kept, even with no queues."""
    out: QueueMap = {}
    for member, queues in assignment.items():
        by_broker: dict[str, list[int]] = {}
        for mq in sort_queues(queues):
            by_broker.setdefault(mq.broker_name, []).append(mq.queue_id)
        out[member] = by_broker
    return out


def decode_queue_map(topic: str, data: Any) -> dict[str, tuple[MessageQueue, ...]]:
    """The inverse of :func:`encode_queue_map`, validating the shape."""
    if not isinstance(data, dict):
        raise DocumentError(f"topic {topic!r}: expected an object of members, got {type(data).__name__}")
    out: dict[str, tuple[MessageQueue, ...]] = {}
    topic = sys.intern(topic)
    for member, by_broker in data.items():
        if not isinstance(by_broker, dict):
            raise DocumentError(f"topic {topic!r}, member {member!r}: expected an object of brokers")
        queues: list[MessageQueue] = []
        for broker, ids in by_broker.items():
            if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise DocumentError(
                    f"topic {topic!r}, member {member!r}, broker {broker!r}: expected a list of queue ids"
                )
            # One string per topic and broker, however many documents name them (an operator
            # keeps thousands).
            name = sys.intern(broker)
            queues.extend(MessageQueue(topic, name, i) for i in ids)
        out[member] = tuple(sort_queues(queues))
    return out


@dataclass(frozen=True)
class Release:
    """Queues revoked from ``owner`` in ``generation`` and held by nobody until it releases them."""

    owner: str
    generation: int
    """The generation that revoked them: an acknowledgement of it (or later) releases them."""
    since: float
    """Unix time of the revocation: the release timeout counts from here."""
    queues: tuple[MessageQueue, ...]
    """The queues of every topic, in RocketMQ's order."""

    def to_json(self) -> dict[str, Any]:
        by_topic: dict[str, dict[str, list[int]]] = {}
        for mq in sort_queues(self.queues):
            by_topic.setdefault(mq.topic, {}).setdefault(mq.broker_name, []).append(mq.queue_id)
        return {"owner": self.owner, "generation": self.generation, "since": self.since, "topics": by_topic}

    @classmethod
    def from_json(cls, data: Any) -> Release:
        if not isinstance(data, dict) or not isinstance(data.get("topics"), dict):
            raise DocumentError(
                "a releasing entry must be an object with owner, generation, since and topics"
            )
        queues = [
            mq
            for topic, by_broker in data["topics"].items()
            for queues in decode_queue_map(topic, {"": by_broker}).values()
            for mq in queues
        ]
        generation = data.get("generation")
        if not isinstance(generation, int) or generation < 0:
            raise DocumentError(f"releasing: generation must be a non-negative integer, got {generation!r}")
        return cls(str(data["owner"]), generation, float(data.get("since", 0.0)), tuple(sort_queues(queues)))


@dataclass(frozen=True)
class LeaseTerms:
    """How long a member may serve its queues without confirmed contact with the API server."""

    seconds: float
    """``leaseSeconds``: the grant ends this long after the sidecar sent its last renewal that succeeded."""
    renew_seconds: float
    """``renewSeconds``: how often the sidecar renews its member Lease."""

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "renewSeconds": self.renew_seconds}

    @classmethod
    def from_json(cls, data: Any) -> LeaseTerms:
        if not isinstance(data, dict):
            raise DocumentError("lease must be an object with seconds and renewSeconds")
        values = []
        for name in ("seconds", "renewSeconds"):
            value = data.get(name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < 1e9:
                raise DocumentError(f"lease.{name} must be a positive number of seconds, got {value!r}")
            values.append(float(value))
        return cls(values[0], values[1])


@dataclass(frozen=True)
class AssignmentDocument:
    """One published generation of a consumer group's assignment."""

    group: str
    """The RocketMQ consumer group name."""
    generation: int
    strategy: str
    message_model: MessageModel
    computed_at: float
    """Unix time (seconds) when the operator computed this generation."""
    reason: str
    members: Mapping[str, str]
    """Member (pod name) -> zone."""
    topics: Mapping[str, Assignment]
    """RocketMQ topic name -> member -> queues."""
    broker_zones: Mapping[str, str] = field(default_factory=dict)
    handover: HandoverMode = HandoverMode.OFF
    """How queues change owner: Off (at once), Release or Orderly (revoke, release, then assign)."""
    releasing: tuple[Release, ...] = ()
    """Queues revoked from their owners and held by nobody until released."""
    lease: LeaseTerms | None = None
    """Time-bounded grants (handover Release and Orderly); None: members serve without one."""

    def queues_of(self, member: str) -> dict[str, tuple[MessageQueue, ...]]:
        """A member's queues per topic; empty tuples where it holds none."""
        return {topic: assignment.get(member, ()) for topic, assignment in self.topics.items()}

    def releasing_of(self, owner: str) -> tuple[Release, ...]:
        """What ``owner`` must release: the revocations still waiting for it."""
        return tuple(r for r in self.releasing if r.owner == owner)

    def same_assignment(self, other: AssignmentDocument | None) -> bool:
        """True when publishing ``self`` after ``other`` would change nothing a consumer sees."""
        return (
            other is not None
            and self.strategy == other.strategy
            and self.message_model == other.message_model
            and dict(self.members) == dict(other.members)
            and dict(self.broker_zones) == dict(other.broker_zones)
            and _normalized(self.topics) == _normalized(other.topics)
            and self.handover == other.handover
            and self.releasing == other.releasing
            and self.lease == other.lease
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "group": self.group,
            "generation": self.generation,
            "strategy": self.strategy,
            "messageModel": self.message_model.value,
            "computedAt": self.computed_at,
            "reason": self.reason,
            "members": dict(sorted(self.members.items())),
            "brokerZones": dict(sorted(self.broker_zones.items())),
            "topics": {topic: encode_queue_map(a) for topic, a in sorted(self.topics.items())},
        }
        if self.handover is not HandoverMode.OFF:
            out["handover"] = self.handover.value
        if self.releasing:
            out["releasing"] = [r.to_json() for r in self.releasing]
        if self.lease is not None:
            out["lease"] = self.lease.to_json()
        return out

    def encode(self) -> str:
        """Compact, key-sorted JSON: equal documents give equal bytes."""
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any) -> AssignmentDocument:
        if not isinstance(data, dict):
            raise DocumentError("an assignment document must be a JSON object")
        with reading("assignment document"):
            generation = data["generation"]
            if not isinstance(generation, int) or generation < 0:
                raise DocumentError(f"generation must be a non-negative integer, got {generation!r}")
            topics = data.get("topics", {})
            if not isinstance(topics, dict):
                raise DocumentError("topics must be an object of topic -> members")
            members = data.get("members", {})
            broker_zones = data.get("brokerZones", {})
            if not isinstance(members, dict) or not isinstance(broker_zones, dict):
                raise DocumentError("members and brokerZones must be objects")
            releasing = data.get("releasing", [])
            if not isinstance(releasing, list):
                raise DocumentError("releasing must be a list")
            return cls(
                group=str(data["group"]),
                generation=generation,
                strategy=str(data["strategy"]),
                message_model=_named(
                    MessageModel, data.get("messageModel", MessageModel.CLUSTERING), "messageModel"
                ),
                computed_at=float(data.get("computedAt", 0.0)),
                reason=str(data.get("reason", "")),
                members={str(k): str(v) for k, v in members.items()},
                broker_zones={str(k): str(v) for k, v in broker_zones.items()},
                topics={t: decode_queue_map(t, a) for t, a in topics.items()},
                handover=_named(HandoverMode, data.get("handover", HandoverMode.OFF), "handover"),
                releasing=tuple(Release.from_json(r) for r in releasing),
                lease=LeaseTerms.from_json(data["lease"]) if data.get("lease") is not None else None,
            )

    @classmethod
    def decode(cls, text: str) -> AssignmentDocument:
        return cls.from_json(load_json(text, "assignment document"))


E = TypeVar("E", MessageModel, HandoverMode)


def _named(kind: type[E], value: Any, field: str) -> E:
    """One of the names ``kind`` has; a DocumentError that lists them for anything else."""
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(member.value for member in kind)
        raise DocumentError(f"{field} is {value!r}; expected one of {names}") from None


def _normalized(topics: Mapping[str, Assignment]) -> dict[str, dict[str, frozenset[MessageQueue]]]:
    return {t: {m: frozenset(q) for m, q in a.items()} for t, a in topics.items()}


def owners(assignment: Mapping[str, Iterable[MessageQueue]]) -> dict[MessageQueue, list[str]]:
    """Queue -> the members that hold it (one in clustering mode, all in broadcasting)."""
    out: dict[MessageQueue, list[str]] = {}
    for member, queues in assignment.items():
        for mq in queues:
            out.setdefault(mq, []).append(member)
    return out
