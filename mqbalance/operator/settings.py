"""The operator's command-line configuration, handed to the handlers through kopf's memo."""

from __future__ import annotations

from dataclasses import dataclass, field

from mqbalance.listener_limits import Limits
from mqbalance.operator.shards import ShardBy

DEFAULT_PROGRESS_DEADLINE = 300.0
"""Seconds keys may wait with no reconcile started or finished before /healthz fails. A reconcile
makes a handful of API requests of at most 30 s each (a route read, 3 s per NameServer), and
every worker would have to be stuck in one for the queue not to move: five minutes of that is a
stuck loop, not a slow API server, and a restart is the way out."""


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    """Namespaces to serve; empty with ``all_namespaces`` for the whole cluster."""
    all_namespaces: bool = False
    metrics_port: int = 8080
    metrics_host: str = "0.0.0.0"
    """The address of /metrics and /healthz, or several separated by commas (the chart: the pod's IP and
    loopback)."""
    journal: str | None = None
    """Append journal lines to this file; standard output when None."""
    leader_election: str | None = None
    """Name of the coordination.k8s.io Lease replicas elect a leader through; None: no election."""
    lease_namespace: str | None = None
    lease_duration: float = 15.0
    shards: int = 1
    """With leader election: shards of the groups, each a Lease held by one of the running replicas."""
    shard_by: ShardBy = "group"
    """What falls into a shard: each group, or each namespace (a replica then watches only its own)."""
    kubeconfig: str | None = None
    debounce_override: float | None = None
    """Use this debounce window for every group instead of its spec.debounceSeconds."""
    workers: int = 8
    """Keys reconciled at once (each key by one worker at a time)."""
    progress_deadline: float = DEFAULT_PROGRESS_DEADLINE
    """/healthz fails once keys have waited this long with no key taken or finished meanwhile."""
    max_requests: int = 32
    """API requests (not watches) in flight at once."""
    name_server: str | None = None
    """NameServer addresses (``a:9876;b:9876``) for Topics whose spec.nameServer names none."""
    name_server_timeout: float = 3.0
    """Seconds for one route request to one NameServer."""
    lag_interval: float = 30.0
    """Seconds between two readings of every group's offsets from its brokers; 0: lag is not read."""
    lag_timeout: float = 3.0
    """Seconds for one offset request to one broker."""
    lag_rate: float = 50.0
    """Offset requests a second at most, over all groups and brokers."""
    lag_queue_metrics: bool = False
    """Export mqbalance_queue_lag: one series per queue of every group."""
    lag_drain_seconds: float = 300.0
    """status.lag.recommendedMembers: members enough to consume the backlog within this time."""
    external_metrics_port: int = 0
    """Serve external.metrics.k8s.io on this HTTPS port; 0: not served."""
    external_metrics_host: str = "0.0.0.0"
    external_metrics_cert_dir: str | None = None
    """Holds tls.crt and tls.key of the external metrics listener."""
    limits: Limits = field(default_factory=Limits)
    """Of each listener: the metrics' and the external metrics'."""
