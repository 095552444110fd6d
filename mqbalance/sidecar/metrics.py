"""The sidecar's Prometheus metrics, in a registry of their own.

Events (rebalances, queues gained or lost, sends, isolations) are counters and
histograms updated as they happen. Broker availability lives in the producer's
fault table and changes with time alone, so it is read at scrape time by a
custom collector instead of being copied into a gauge. The build info and the process's
own metrics come with the registry (mqbalance.process_metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mqbalance.process_metrics import register_process_metrics

PREFIX = "mqbalance_sidecar"

# Operator compute -> sidecar receipt: a watch event is tens of milliseconds, a
# mounted-file fallback up to a minute or two.
PROPAGATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
MOVE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
"""A move's steps: milliseconds when nothing waits, up to the handover's minutes."""
SEND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.55, 1, 1.8, 3, 5, 15, 30)
"""Includes the fault tables' latency bounds (50, 100, 550, 1800, 3000, 5000, 15000 ms)."""

BrokerStates = Callable[[], Iterable[tuple[str, bool]]]
"""Returns (broker, available) for every broker the fault table knows."""


class _BrokerAvailability(Collector):
    def __init__(self, states: BrokerStates) -> None:
        self._states = states

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            f"{PREFIX}_broker_available",
            "1 while the latency fault table lets sends go to the broker, 0 while it is isolated.",
            labels=["broker"],
        )

    def describe(self) -> Iterable[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = self._family()
        for broker, available in self._states():
            family.add_metric([broker], 1.0 if available else 0.0)
        yield family


class SidecarMetrics:
    """Every metric the sidecar exports; ``registry`` is what ``/metrics`` renders."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        register_process_metrics(r, "sidecar")
        self.assignment_generation = Gauge(
            f"{PREFIX}_assignment_generation",
            "Generation of the assignment the sidecar serves.",
            ["group"],
            registry=r,
        )
        self.owned_queues = Gauge(
            f"{PREFIX}_owned_queues",
            "Queues this pod holds in the served assignment, all topics together.",
            ["group"],
            registry=r,
        )
        self.queues_added = Counter(
            f"{PREFIX}_queues_added",
            "Queues this pod gained across rebalances.",
            ["group"],
            registry=r,
        )
        self.queues_revoked = Counter(
            f"{PREFIX}_queues_revoked",
            "Queues this pod lost across rebalances.",
            ["group"],
            registry=r,
        )
        self.rebalances = Counter(
            f"{PREFIX}_rebalances",
            "Assignment generations the sidecar received.",
            ["group"],
            registry=r,
        )
        self.propagation_delay = Histogram(
            f"{PREFIX}_propagation_delay_seconds",
            "From the operator computing a generation to the sidecar receiving it.",
            ["group"],
            buckets=PROPAGATION_BUCKETS,
            registry=r,
        )
        self.move_steps = Histogram(
            f"{PREFIX}_move_step_seconds",
            "From the sidecar serving a generation that changed the pod's queues to each step of the move: "
            "read (the application was answered with it), applied and committed (as the application's "
            "helper reports them with its release), released (the release arrived), recorded (the release "
            "was written for the operator), consumed (the helper's first consumption of a queue it gained, "
            "as it reports it).",
            ["group", "step"],
            buckets=MOVE_BUCKETS,
            registry=r,
        )
        self.long_polls = Gauge(
            f"{PREFIX}_long_polls",
            "Long-poll requests waiting now for a new generation.",
            ["group"],
            registry=r,
        )
        self.watch_restarts = Counter(
            f"{PREFIX}_watch_restarts",
            "Watches of the API server restarted after an error or an expired resourceVersion.",
            ["resource"],
            registry=r,
        )
        for resource in ("configmap", "topics"):  # exported at 0 from the start, not from the first restart
            self.watch_restarts.labels(resource)
        self.invalid_documents = Counter(
            f"{PREFIX}_invalid_documents",
            "Assignment documents that could not be read; the previous one stays served.",
            ["group"],
            registry=r,
        )
        self.fenced = Gauge(
            f"{PREFIX}_fenced",
            "1 while the group's grant has expired (no Lease renewal reached the API server for "
            "leaseSeconds): the sidecar serves no queues.",
            ["group"],
            registry=r,
        )
        self.application_gone = Counter(
            f"{PREFIX}_application_gone",
            "Times every application of the pod that named its RocketMQ client closed its connections "
            "to the sidecar (it exited or crashed): its queues were given on at once.",
            registry=r,
        )
        self.connected_clients = Gauge(
            f"{PREFIX}_connected_clients",
            "RocketMQ clients of the pod's applications with a connection open to the sidecar now.",
            registry=r,
        )
        self.lease_renewals = Counter(
            f"{PREFIX}_lease_renewals",
            "Member Lease renewals, by result (ok, failed).",
            ["result"],
            registry=r,
        )
        self.broker_isolations = Counter(
            f"{PREFIX}_broker_isolations",
            "Send reports that put a broker into isolation (a window longer than zero).",
            ["broker"],
            registry=r,
        )
        self.send_latency = Histogram(
            f"{PREFIX}_send_latency_seconds",
            "Send latencies reported by the producer, failures included.",
            buckets=SEND_BUCKETS,
            registry=r,
        )

    def watch_brokers(self, states: BrokerStates) -> None:
        """Export ``mqbalance_sidecar_broker_available`` from ``states`` at every scrape."""
        self.registry.register(_BrokerAvailability(states))
