"""Who is in a consumer group, and in which zone.

A pod is a member while it matches the group's selector, is Running and Ready and
is not terminating; its consumer id is its name and its zone is its node's zone
label. These are plain snapshots of the API objects so the reconcile stays pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mqbalance.model import UNKNOWN_ZONE
from mqbalance.operator.spec import LabelSelector


@dataclass(frozen=True)
class PodInfo:
    """What the operator keeps of a Pod."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    node_name: str = ""
    running: bool = False
    ready: bool = False
    terminating: bool = False

    @property
    def serving(self) -> bool:
        """Running, Ready and not terminating: able to consume."""
        return self.running and self.ready and not self.terminating


def pod_info(body: Mapping[str, Any]) -> PodInfo:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return PodInfo(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        node_name=spec.get("nodeName") or "",
        running=status.get("phase") == "Running",
        ready=ready,
        terminating=meta.get("deletionTimestamp") is not None,
    )


def members(
    pods: Iterable[PodInfo],
    selector: LabelSelector,
    node_labels: Mapping[str, Mapping[str, str]],
    zone_label: str,
) -> dict[str, str]:
    """Member pod name -> zone. A node without the label, or unknown to us, puts its pods in UNKNOWN_ZONE."""
    out: dict[str, str] = {}
    for pod in pods:
        if pod.serving and selector.matches(pod.labels):
            out[pod.name] = (node_labels.get(pod.node_name) or {}).get(zone_label) or UNKNOWN_ZONE
    return out
