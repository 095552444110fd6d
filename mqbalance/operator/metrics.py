"""Prometheus metrics and the HTTP endpoint that serves them with the liveness probe.

Events (rebalances, moves, errors, durations) are counters and a histogram; the
state of each group (members, queues, imbalance...) lives in the operator and is
read by a custom Collector at scrape time, so a deleted group simply disappears.
So is this replica's part in leader election (the leader Lease, the shards it holds), which
every replica exports, standbys included, with the build info and the process's metrics: they
tell "no operator" and "no leader" apart from "nothing to do".
Everything is registered on a registry passed in, never the global one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mqbalance import listener
from mqbalance.listener import Limits, parse_hosts
from mqbalance.model import MessageQueue
from mqbalance.operator.handover import Step
from mqbalance.process_metrics import exposition, register_process_metrics

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HANDOVER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class GroupGauges:
    """One group's state as the metrics show it."""

    namespace: str
    group: str
    """The ConsumerGroup resource name."""
    members: int
    queues: int
    imbalance: int
    """max load - min load over all of the group's topics, in queues."""
    topic_imbalance: int
    """The largest max load - min load within one topic, in queues."""
    cross_zone_queues: int
    unassigned_queues: int
    generation: int
    invalid: bool
    paused: bool = False
    """Held paused (status.pausedBy): nothing is assigned."""
    flapping_members: int = 0
    """Members that joined or left more than 3 times in 10 minutes (status.flappingMembers)."""


# metric name, help, GroupGauges attribute
GROUP_GAUGES = (
    (
        "mqbalance_group_members",
        "Members (Running, Ready, not terminating pods) of the consumer group.",
        "members",
    ),
    ("mqbalance_group_queues", "Readable queues of all topics the group subscribes to.", "queues"),
    (
        "mqbalance_group_imbalance",
        "Most minus fewest queues held by one member, counting all of the group's topics together.",
        "imbalance",
    ),
    (
        "mqbalance_group_topic_imbalance",
        "Most minus fewest queues of one topic held by one member, for the group's most uneven topic.",
        "topic_imbalance",
    ),
    (
        "mqbalance_group_cross_zone_queues",
        "Queues held by a member outside their broker's zone.",
        "cross_zone_queues",
    ),
    ("mqbalance_group_unassigned_queues", "Queues assigned to no member.", "unassigned_queues"),
    ("mqbalance_group_assignment_generation", "Generation of the published assignment.", "generation"),
    (
        "mqbalance_group_invalid",
        "1 while the group's spec cannot be honoured (condition Invalid).",
        "invalid",
    ),
    (
        "mqbalance_group_paused",
        "1 while the group is held paused (status.pausedBy): its members are assigned nothing.",
        "paused",
    ),
    (
        "mqbalance_group_flapping_members",
        "Members that joined or left the group more than 3 times in 10 minutes (condition Flapping).",
        "flapping_members",
    ),
)


@dataclass(frozen=True)
class LagFigures:
    """One group's lag as the metrics show it (the lag loop's last reading)."""

    total: int
    consume_rate: float | None
    """Messages a second committed; None until two readings in a row succeeded."""
    produce_rate: float | None
    members: tuple[tuple[str, int], ...]
    """(member, lag) for every member of the published assignment."""
    queues: tuple[tuple[MessageQueue, int], ...]
    """(queue, lag); only with per-queue metrics on (--lag-queue-metrics)."""
    available: bool
    """Every broker answered."""
    load_spread: float | None = None
    """The busiest member's produce rate over the mean member's; None until rates are known."""
    recommended_members: int | None = None
    """status.lag.recommendedMembers; None until two readings in a row gave rates."""


# metric name, help, LagFigures attribute: one series a group, none while the figure is None
LAG_GAUGES = (
    (
        "mqbalance_group_lag",
        "Messages stored but not yet consumed by the group, over its topics' queues that could be read.",
        "total",
    ),
    (
        "mqbalance_group_consume_rate",
        "Messages a second the group committed between its last two offset readings.",
        "consume_rate",
    ),
    (
        "mqbalance_group_produce_rate",
        "Messages a second stored in the group's queues between its last two offset readings.",
        "produce_rate",
    ),
    (
        "mqbalance_group_load_spread",
        "The busiest member's produce rate over the mean member's in the published assignment (1: even).",
        "load_spread",
    ),
    (
        "mqbalance_group_recommended_members",
        "Members the group needs to keep up and drain its backlog (status.lag.recommendedMembers).",
        "recommended_members",
    ),
    (
        "mqbalance_group_lag_available",
        "1 when every broker of the group's topics answered the last offset reading, else 0.",
        "available",
    ),
)


def _group_families(gauges: Iterable[tuple[str, str, str]]) -> dict[str, GaugeMetricFamily]:
    """A family labelled by namespace and group for each (metric name, help, attribute), by attribute."""
    return {attr: GaugeMetricFamily(name, doc, labels=["namespace", "group"]) for name, doc, attr in gauges}


def _add_group(families: dict[str, GaugeMetricFamily], namespace: str, group: str, figures: object) -> None:
    """A group's series in each family: its figure of the family's attribute, unless that is None."""
    for attr, family in families.items():
        value = getattr(figures, attr)
        if value is not None:
            family.add_metric([namespace, group], float(value))


class LagCollector(Collector):
    """Lag per group and per member (bounded by the groups' sizes); per queue only when asked for."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, str, LagFigures]]]) -> None:
        self._source = source

    @staticmethod
    def _families() -> tuple[dict[str, GaugeMetricFamily], GaugeMetricFamily, GaugeMetricFamily]:
        member = GaugeMetricFamily(
            "mqbalance_member_lag",
            "Messages not yet consumed in the queues the published assignment gives the member.",
            labels=["namespace", "group", "member"],
        )
        queue = GaugeMetricFamily(
            "mqbalance_queue_lag",
            "Messages not yet consumed in one queue (only with --lag-queue-metrics).",
            labels=["namespace", "group", "topic", "broker", "queue"],
        )
        return _group_families(LAG_GAUGES), member, queue

    def describe(self) -> Iterator[Metric]:
        # Names without samples: a scrape restricted to other names (name[]) skips collect().
        families, member, queue = self._families()
        yield from (*families.values(), member, queue)

    def collect(self) -> Iterator[Metric]:
        families, member, queue = self._families()
        for namespace, group, f in self._source():
            _add_group(families, namespace, group, f)
            for name, lag in f.members:
                member.add_metric([namespace, group, name], float(lag))
            for mq, lag in f.queues:
                queue.add_metric([namespace, group, mq.topic, mq.broker_name, str(mq.queue_id)], float(lag))
        yield from (*families.values(), member, queue)


class GroupCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[GroupGauges]]) -> None:
        self._source = source

    def describe(self) -> Iterator[Metric]:
        yield from _group_families(GROUP_GAUGES).values()

    def collect(self) -> Iterator[Metric]:
        families = _group_families(GROUP_GAUGES)
        for g in self._source():
            _add_group(families, g.namespace, g.group, g)
        yield from families.values()


@dataclass(frozen=True)
class Leadership:
    """This replica's part in leader election, as the metrics show it."""

    lease: str
    """The leader Lease's name, the shard Leases' prefix (--leader-election); "" without leader election."""
    leader: bool
    """Holds the leader Lease, or runs without leader election (the single writer); never with shards."""
    shards: int
    """Shards the groups fall into (--shards): 1 without sharding, where the leader Lease is the one shard."""
    shards_held: int
    """Shard Leases held now; without sharding 1 for the leader, 0 for a standby."""


UNELECTED = Leadership(lease="", leader=True, shards=1, shards_held=1)
"""A single operator without leader election: it always acts."""


# metric name, help, Leadership attribute
LEADERSHIP_GAUGES = (
    (
        "mqbalance_operator_leader",
        "1 while this replica holds the leader Lease (or runs without leader election), else 0; "
        "always 0 with --shards above 1, where mqbalance_operator_shards_held counts.",
        "leader",
    ),
    ("mqbalance_operator_shards", "Shards the groups fall into (--shards); 1 without sharding.", "shards"),
    (
        "mqbalance_operator_shards_held",
        "Shard Leases this replica holds now; without sharding 1 while it leads, 0 on standby.",
        "shards_held",
    ),
)


class LeadershipCollector(Collector):
    def __init__(self, source: Callable[[], Leadership]) -> None:
        self._source = source

    def describe(self) -> Iterator[Metric]:
        for name, doc, _ in LEADERSHIP_GAUGES:
            yield GaugeMetricFamily(name, doc, labels=["lease"])

    def collect(self) -> Iterator[Metric]:
        state = self._source()
        for name, doc, attr in LEADERSHIP_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["lease"])
            family.add_metric([state.lease], float(getattr(state, attr)))
            yield family


class OperatorMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        groups: Callable[[], Iterable[GroupGauges]],
        leadership: Callable[[], Leadership] = lambda: UNELECTED,
        lag: Callable[[], Iterable[tuple[str, str, LagFigures]]] = lambda: (),
    ) -> None:
        self.registry = registry
        register_process_metrics(registry, "operator")
        # prometheus_client appends _total to counters.
        self.rebalances = Counter(
            "mqbalance_rebalances",
            "Published assignment generations, by reason.",
            ["reason"],
            registry=registry,
        )
        self.queues_moved = Counter(
            "mqbalance_queues_moved", "Queues that changed owner in published generations.", registry=registry
        )
        self.reconcile_errors = Counter(
            "mqbalance_reconcile_errors",
            "Reconciles that failed, by kind (api, conflict, internal).",
            ["kind"],
            registry=registry,
        )
        self.reconciles = Counter(
            "mqbalance_reconciles",
            "Reconciles of a group, by result (published, unchanged, invalid, error).",
            ["result"],
            registry=registry,
        )
        self.rebalance_duration = Histogram(
            "mqbalance_rebalance_duration_seconds",
            "Time to compute and publish a new generation (allocation plus the ConfigMap write).",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.handover_revoked = Counter(
            "mqbalance_handover_revoked_queues",
            "Queues revoked from their owner and held by nobody until released (handover Release, Orderly).",
            registry=registry,
        )
        self.handover_assigned = Counter(
            "mqbalance_handover_assigned_queues",
            "Revoked queues given to their new owner, by why: released (acknowledged), gone (the owner's pod "
            "is gone) or overridden (no acknowledgement in time).",
            ["outcome"],
            registry=registry,
        )
        self.broker_unlocks = Counter(
            "mqbalance_broker_unlocked_queues",
            "Queues whose broker locks the operator released for a member known stopped (handover Orderly), "
            "by result: released, or failed (they expire as before).",
            ["result"],
            registry=registry,
        )
        self.generation_latency = Histogram(
            "mqbalance_generation_latency_seconds",
            "From the first change a reconcile answered (a pod, node, Topic, spec or release the operator "
            "saw) to the publication of the generation it computed, by reason: the debounce window, the "
            "queue, the computation and the write.",
            ["reason"],
            buckets=HANDOVER_BUCKETS,
            registry=registry,
        )
        self.handover_wait = Histogram(
            "mqbalance_handover_wait_seconds",
            "From a revocation to its queues' assignment to their new owners.",
            buckets=HANDOVER_BUCKETS,
            registry=registry,
        )
        self.events_dropped = Counter(
            "mqbalance_operator_events_dropped",
            "Events not posted because too many were waiting (more than 1000, as client-go's limit).",
            registry=registry,
        )
        self.lag_requests = Counter(
            "mqbalance_lag_requests",
            "Offset requests (GET_CONSUME_STATS) to brokers and route reads that failed, by result "
            "(ok, BrokerUnreachable, QueryRefused, NoRoute, NoNameServer, NoCredentials).",
            ["result"],
            registry=registry,
        )
        registry.register(GroupCollector(groups))
        registry.register(LagCollector(lag))
        registry.register(LeadershipCollector(leadership))

    def observe_lag_read(self, requests: int, failures: Sequence[str]) -> None:
        """One group's offset reading: ``requests`` sent to brokers, ``failures`` by reason."""
        broker_failures = sum(1 for r in failures if r in ("BrokerUnreachable", "QueryRefused"))
        if requests - broker_failures > 0:
            self.lag_requests.labels("ok").inc(requests - broker_failures)
        for reason in failures:
            self.lag_requests.labels(reason).inc()

    def observe_handover(self, step: Step) -> None:
        self.handover_revoked.inc(step.revoked)
        for outcome, count in (
            ("released", step.released),
            ("gone", step.gone),
            ("overridden", step.overridden),
        ):
            if count:
                self.handover_assigned.labels(outcome).inc(count)
        for seconds in step.waited:
            self.handover_wait.observe(seconds)


def create_app(registry: CollectorRegistry, health: Callable[[], dict[str, Any]]) -> web.Application:
    """``/metrics`` in the Prometheus text format and ``/healthz`` for the liveness probe: 503 with
    the ``problems`` that ``health`` names, if any."""

    async def metrics(request: web.Request) -> web.Response:
        body = exposition(registry, request.query.getall("name[]", []))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        # Answering at all proves the event loop is not blocked; problems say the work loop is stuck.
        state = health()
        if state.get("problems"):
            return web.json_response({"status": "failing", **state}, status=503)
        return web.json_response({"status": "ok", **state})

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz)])
    return app


async def serve(
    app: web.Application, port: int, host: str = "0.0.0.0", limits: Limits | None = None
) -> web.AppRunner:
    """Listen on ``host`` (addresses separated by commas) under ``limits`` (mqbalance/listener.py)."""
    return await listener.serve(app, parse_hosts(host), port, limits or Limits())
