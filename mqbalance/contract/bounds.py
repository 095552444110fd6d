"""The bounds on what one Topic or ConsumerGroup may ask of the operator, each written once, here.

One operator serves every team's groups, so nothing one tenant writes may take its memory: a
route's queues become objects when a group is reconciled, and a group's assignment is computed,
compared and published whole. The CRDs carry the same numbers (``maxItems``, ``maximum`` and CEL
rules; a unit test holds them equal to these); the checks below repeat them for what the schema
cannot reach (a route read from a NameServer, an object written before a rule existed or through an
API server without CEL, the pods a selector matches, the document an assignment makes) and count
from queue numbers, before any queue list is built. docs/operator.md ("Bounds") lists them.
"""

from __future__ import annotations

from collections.abc import Sequence

from mqbalance.contract.errors import SpecError
from mqbalance.model import Broker

MAX_QUEUES_PER_BROKER = 1024
"""readQueueNums and writeQueueNums of one broker in a route (a static topic's scope counts as one)."""
MAX_BROKERS_PER_TOPIC = 64
"""Brokers in one route."""
MAX_QUEUES_PER_TOPIC = 4096
"""readQueueNums summed over a route's brokers, and writeQueueNums likewise, whatever their perm."""
MAX_TOPICS_PER_GROUP = 64
"""Topics one ConsumerGroup subscribes (``spec.topics``)."""
MAX_QUEUES_PER_GROUP = 16384
"""Queues the members of one group hold together: the read queues of all its topics, in
BROADCASTING times its members (every member holds every queue)."""
MAX_MEMBERS_PER_GROUP = 256
"""Members (Running and Ready pods the selector matches) of one group. STICKY's decision grows with
the square of the members (times the topics): 256 take a few seconds of CPU at the other bounds,
1,000 took minutes."""
MAX_QUEUES_TIMES_MEMBERS = 2_097_152
"""A group's read queues times its members (16,384 queues over 128 members, 8,192 over 256): what a
reconcile's memory and the rest of its work grow with."""
MAX_ASSIGNMENT_BYTES = 1024 * 1024
"""The assignment ConfigMap's data: Kubernetes refuses a ConfigMap holding more (``MaxSecretSize``)."""
MAX_MIN_READY_SECONDS = 3600
"""A ConsumerGroup's ``spec.minReadySeconds``: an hour; a pod that flapped waits up to eight times it."""
MAX_HISTORY = 10
"""Generations a ConsumerGroup's ``status.history`` lists, newest first: the status is patched whole
at every change, so it stays a few hundred bytes."""
MAX_RESET_QUEUES = 4096
"""Queues one OffsetReset covers at most: each is a line of its status (a few hundred KiB at most)."""

ROUTE_TOO_LARGE = "RouteTooLarge"
TOO_MANY_TOPICS = "TooManyTopics"
TOO_MANY_QUEUES = "TooManyQueues"
TOO_MANY_MEMBERS = "TooManyMembers"
ASSIGNMENT_TOO_LARGE = "AssignmentTooLarge"

SEE = "(docs/operator.md, Bounds)"


class OverBound(SpecError):
    """A Topic or group over one of the bounds; ``reason`` is the condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_route(where: str, brokers: Sequence[Broker]) -> None:
    """OverBound (RouteTooLarge) when the route of ``where`` is over a bound: counted from the
    brokers' queue numbers, no queue is built."""
    if len(brokers) > MAX_BROKERS_PER_TOPIC:
        raise OverBound(
            ROUTE_TOO_LARGE,
            f"{where}: the route has {len(brokers)} brokers, over the bound of {MAX_BROKERS_PER_TOPIC} "
            f"brokers per topic {SEE}",
        )
    for b in brokers:
        for key, count in (("readQueueNums", b.read_queue_nums), ("writeQueueNums", b.write_queue_nums)):
            if count > MAX_QUEUES_PER_BROKER:
                raise OverBound(
                    ROUTE_TOO_LARGE,
                    f"{where}: broker {b.name} has {key} {count}, over the bound of {MAX_QUEUES_PER_BROKER} "
                    f"queues per broker {SEE}",
                )
    for kind, count in (
        ("read", read_queue_count(brokers)),
        ("write", sum(b.write_queue_nums for b in brokers)),
    ):
        if count > MAX_QUEUES_PER_TOPIC:
            raise OverBound(
                ROUTE_TOO_LARGE,
                f"{where}: the route has {count} {kind} queues, over the bound of {MAX_QUEUES_PER_TOPIC} "
                f"queues per topic {SEE}",
            )


def read_queue_count(brokers: Sequence[Broker]) -> int:
    """readQueueNums summed over ``brokers``: the measure of the per-topic and per-group bounds."""
    return sum(b.read_queue_nums for b in brokers)


def check_topics(count: int) -> None:
    if count > MAX_TOPICS_PER_GROUP:
        raise OverBound(
            TOO_MANY_TOPICS,
            f"spec.topics lists {count} Topics, over the bound of {MAX_TOPICS_PER_GROUP} topics per "
            f"group {SEE}",
        )


def check_members(count: int) -> None:
    if count > MAX_MEMBERS_PER_GROUP:
        raise OverBound(
            TOO_MANY_MEMBERS,
            f"the selector matches {count} members (Running and Ready pods), over the bound of "
            f"{MAX_MEMBERS_PER_GROUP} members per group {SEE}",
        )


def check_group_queues(queues: int, members: int, broadcasting: bool) -> None:
    """OverBound (TooManyQueues) when the group's topics have more read queues than the bound, or
    in BROADCASTING its members would hold more together (each holds every queue)."""
    if queues > MAX_QUEUES_PER_GROUP:
        raise OverBound(
            TOO_MANY_QUEUES,
            f"the group's topics have {queues} read queues, over the bound of {MAX_QUEUES_PER_GROUP} queues "
            f"per group {SEE}",
        )
    if queues * members > MAX_QUEUES_TIMES_MEMBERS:
        raise OverBound(
            TOO_MANY_QUEUES,
            f"the group's {queues} read queues over its {members} members make {queues * members} "
            f"queue-member pairs, over the bound of {MAX_QUEUES_TIMES_MEMBERS} per group: fewer queues or "
            f"members make it fit, and members beyond the queue count hold nothing anyway {SEE}",
        )
    if broadcasting and queues * members > MAX_QUEUES_PER_GROUP:
        raise OverBound(
            TOO_MANY_QUEUES,
            f"BROADCASTING gives each of {members} members all {queues} read queues: {queues * members} "
            f"queues held, over the bound of {MAX_QUEUES_PER_GROUP} queues per group {SEE}",
        )


def check_assignment_size(size: int) -> None:
    """OverBound (AssignmentTooLarge) when the assignment ConfigMap's data would be ``size`` bytes,
    more than Kubernetes stores."""
    if size > MAX_ASSIGNMENT_BYTES:
        raise OverBound(
            ASSIGNMENT_TOO_LARGE,
            f"the assignment document is {size} bytes, over the bound of {MAX_ASSIGNMENT_BYTES} bytes a "
            f"ConfigMap holds {SEE}; fewer topics or members make it smaller",
        )
