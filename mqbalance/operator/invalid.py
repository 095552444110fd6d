"""A spec that cannot be honoured: the subscribed Topics' routes (and why they cannot be read), a
group over a bound, and the outcome that says so while the last good assignment stays in force."""

from __future__ import annotations

from collections.abc import Mapping

from mqbalance.contract import SpecError, configmap_name, read_topic
from mqbalance.contract.bounds import check_group_queues, check_members, read_queue_count
from mqbalance.model import MessageModel, TopicRoute
from mqbalance.operator.conditions import condition, condition_status
from mqbalance.operator.observation import Interest, Note, Observed, Outcome
from mqbalance.operator.spec import GroupSpec, subscribed_topics
from mqbalance.operator.status import int_field, set_condition


class TopicNotFound(SpecError):
    """A subscribed Topic resource does not exist."""


def subscribed_routes(obs: Observed, spec: GroupSpec) -> list[TopicRoute]:
    missing = [t for t in spec.topics if t not in obs.topics]
    if missing:
        names = ", ".join(repr(t) for t in missing)
        raise TopicNotFound(
            f"Topic {names} not found in namespace {obs.namespace!r}; create it or remove it from spec.topics"
        )
    routes = [read_topic(t, obs.topics[t], obs.routes.get(t)) for t in spec.topics]
    by_name: dict[str, str] = {}
    for resource, route in zip(spec.topics, routes, strict=True):
        other = by_name.setdefault(route.topic, resource)
        if other != resource:
            raise SpecError(
                f"Topics {other!r} and {resource!r} both name RocketMQ topic "
                f"{route.topic!r}; subscribe to one"
            )
    return routes


def check_group_bounds(spec: GroupSpec, routes: list[TopicRoute], member_zones: Mapping[str, str]) -> None:
    """OverBound when the group's members or the queues they would hold together are over a bound:
    counted from the routes' queue numbers, before any queue is built or allocated."""
    check_members(len(member_zones))
    queues = sum(read_queue_count(route.brokers) for route in routes)
    check_group_queues(queues, len(member_zones), spec.message_model is MessageModel.BROADCASTING)


def invalid_outcome(
    obs: Observed, reason: str, message: str, member_zones: Mapping[str, str], spec: GroupSpec | None = None
) -> Outcome:
    """Keep the published assignment and its figures; say why nothing new can be published."""
    status = dict(obs.status)
    conditions = list(obs.status.get("conditions") or [])
    generation = (
        obs.previous.generation if obs.previous else int_field(obs.status.get("assignmentGeneration"))
    )
    kept = f"generation {generation} stays in force" if generation else "nothing is published yet"
    conditions = set_condition(conditions, "Invalid", "True", reason, message, obs.now, obs.generation)
    conditions = set_condition(
        conditions, "Ready", "False", reason, f"the spec cannot be honoured; {kept}", obs.now, obs.generation
    )
    for kind in ("Balanced", "Degraded"):
        if condition_status({"conditions": conditions}, kind) is None:
            conditions = set_condition(conditions, kind, "Unknown", reason, kept, obs.now, obs.generation)
    status.update(
        observedGeneration=obs.generation,
        assignmentConfigMap=configmap_name(obs.name),
        conditions=conditions,
    )
    if generation:
        status["assignmentGeneration"] = generation
    notes: tuple[Note, ...] = ()
    old = condition(obs.status, "Invalid")
    if not old or old.get("status") != "True" or old.get("message") != message:
        notes = (Note("Warning", reason, message),)
    if spec is None:  # the spec cannot be read: any change may make it valid
        return Outcome(
            None, status, notes, members=member_zones, interest=Interest(topics=subscribed_topics(obs.spec))
        )
    return Outcome(
        None,
        status,
        notes,
        members=member_zones,
        interest=Interest.of(spec, obs.pods),
        ensure_releases=obs.lacks_releases(spec),
    )
