"""The operator's command-line configuration, handed to the handlers through kopf's memo."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    """Namespaces to serve; empty with ``all_namespaces`` for the whole cluster."""
    all_namespaces: bool = False
    metrics_port: int = 8080
    metrics_host: str = "0.0.0.0"
    journal: str | None = None
    """Append journal lines to this file; standard output when None."""
    peering: str | None = None
    """kopf peering object name; None runs standalone."""
    leader_election: str | None = None
    """Name of the coordination.k8s.io Lease replicas elect a leader through; None: no election."""
    lease_namespace: str | None = None
    lease_duration: float = 15.0
    kubeconfig: str | None = None
    debounce_override: float | None = None
    """Use this debounce window for every group instead of its spec.debounceSeconds."""
    batch_window: float = 0.001
    """kopf's per-object event batching window, seconds."""
