"""Who is in a consumer group, and in which zone.

A pod is a member while it matches the group's selector, is Running and Ready, is not
terminating and, with a leased handover (Release, Orderly), has not let its member Lease lapse
(leases.py); its consumer id is its name and its zone is its node's zone
label. A matching pod that is not a member keeps why (a container's waiting reason such
as CrashLoopBackOff or ImagePullBackOff, a failing readiness probe, its node NotReady),
for the group's status. These are plain snapshots of the API objects so the reconcile
stays pure.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from mqbalance.contract import Ack
from mqbalance.contract.names import INJECTION_LABEL, SIDECAR_CONTAINER, SIDECAR_GROUP_ANNOTATION
from mqbalance.model import UNKNOWN_ZONE
from mqbalance.operator.leases import MemberLeases
from mqbalance.operator.spec import LabelSelector


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the operator keeps of a Pod."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    node_name: str = ""
    running: bool = False
    ready: bool = False
    terminating: bool = False
    finished: bool = False
    """Phase Succeeded or Failed: its containers have stopped for good (it holds nothing any more)."""
    reason: str = ""
    """Why the pod is not serving, in CamelCase (CrashLoopBackOff, NotReady, NodeNotReady...); "" if it is."""
    message: str = ""
    """The details behind ``reason``, e.g. which container and what the kubelet said."""
    lease_lapsed: bool = False
    """Its sidecar's member Lease has not been renewed for leaseSeconds (set by :func:`lease_lapsed`
    for one reconcile, never by the informer)."""
    sidecar_missing: bool = False
    """It asks for a sidecar (the annotation ``mqbalance.io/sidecar-group``) but runs none: it was
    not injected (not labelled for it, or admitted while the injector was away), so nothing in it
    would serve queues."""
    ready_since: float | None = None
    """Unix time of its Ready condition's last transition (None: not reported)."""
    restarts: int = 0
    """Container restarts since the pod started (every container's restartCount)."""
    restarted_at: float | None = None
    """Unix time its latest restarted container last terminated (None: none has)."""
    settling: bool = False
    """Ready for less than the group's minReadySeconds (set by :func:`settling` for one reconcile,
    never by the informer): not given queues yet."""
    application_gone: bool = False
    """Its sidecar said its application went away (an ``absent`` acknowledgement of the latest
    generation; set by :func:`application_gone` for one reconcile, never by the informer)."""

    @property
    def serving(self) -> bool:
        """Running, Ready, not terminating, with its sidecar, and renewing its member Lease if it must:
        able to consume."""
        return (
            self.running
            and self.ready
            and not self.terminating
            and not self.lease_lapsed
            and not self.sidecar_missing
            and not self.settling
            and not self.application_gone
        )


MAX_MESSAGE = 200
"""Longest kept message: the kubelet's can quote a whole image pull error."""
# Waiting reasons every starting container passes through: not worth reporting as a cause.
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})


def pod_info(body: Mapping[str, Any]) -> PodInfo:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    ready_condition: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    containers = status.get("containerStatuses") or []
    finished_at = [
        t
        for c in containers
        if (t := unix_time(((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt")))
        is not None
    ]
    info = PodInfo(
        name=meta.get("name", ""),
        labels=_shared_labels(meta.get("labels") or {}),
        node_name=sys.intern(spec.get("nodeName") or ""),
        running=status.get("phase") == "Running",
        ready=ready,
        terminating=meta.get("deletionTimestamp") is not None,
        finished=status.get("phase") in ("Succeeded", "Failed"),
        sidecar_missing=_asks_for_sidecar(meta) and not _has_sidecar(spec),
        ready_since=unix_time(ready_condition.get("lastTransitionTime")),
        restarts=sum(int(c.get("restartCount") or 0) for c in containers),
        restarted_at=max(finished_at, default=None),
    )
    if info.serving:
        return info
    reason, message = why_not_serving(info, spec, status)
    return replace(info, reason=reason, message=message[:MAX_MESSAGE])


SIDECAR_MISSING = "SidecarMissing"
MIN_READY = "MinReadySeconds"
FLAP_BACKOFF = "FlapBackoff"
FLAP_WINDOW = 600.0
"""A container restart this recent makes its pod wait longer than minReadySeconds (seconds)."""
MAX_FLAP_FACTOR = 8
"""The longest wait of a pod that restarts again and again: minReadySeconds times this."""


def unix_time(value: Any) -> float | None:
    """An RFC 3339 time of the API (``2026-11-28T20:00:00Z``) in Unix seconds; None: absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def ready_wait(pod: PodInfo, min_ready: float, now: float) -> float:
    """How long ``pod`` must have been Ready before it is given queues: ``min_ready``, doubled for
    each restart of its containers (up to :data:`MAX_FLAP_FACTOR` times) while its latest restart is
    under :data:`FLAP_WINDOW` old, so a crash-looping pod waits longer each time and a stable one
    does not pay for restarts long past."""
    if min_ready <= 0:
        return 0.0
    recent = pod.restarted_at is not None and now - pod.restarted_at < FLAP_WINDOW
    return min_ready * (min(2**pod.restarts, MAX_FLAP_FACTOR) if recent and pod.restarts else 1)


def settling(pods: Iterable[PodInfo], min_ready: float, now: float) -> tuple[list[PodInfo], float | None]:
    """``pods``, with those that would serve but have been Ready for less than their wait
    (:func:`ready_wait`) marked not serving; and the earliest time one of them is Ready long enough
    (None: none waits). A pod that reports no Ready transition time is not held back."""
    out: list[PodInfo] = []
    due: list[float] = []
    for pod in pods:
        if pod.serving and pod.ready_since is not None:
            wait = ready_wait(pod, min_ready, now)
            ready_at = pod.ready_since + wait
            if now < ready_at:
                reason = FLAP_BACKOFF if wait > min_ready else MIN_READY
                why = (
                    "minReadySeconds" if reason == MIN_READY else f"minReadySeconds, {pod.restarts} restarts"
                )
                ready_for = max(0.0, now - pod.ready_since)
                message = f"Ready for {ready_for:.0f}s of the {wait:g}s ({why}) before it is given queues"
                pod = replace(pod, settling=True, reason=reason, message=message)
                due.append(ready_at)
        out.append(pod)
    return out, min(due, default=None)


def _asks_for_sidecar(meta: Mapping[str, Any]) -> bool:
    return SIDECAR_GROUP_ANNOTATION in (meta.get("annotations") or {})


def _has_sidecar(spec: Mapping[str, Any]) -> bool:
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    return any(isinstance(c, dict) and c.get("name") == SIDECAR_CONTAINER for c in containers)


def why_not_serving(info: PodInfo, spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, str]:
    """(reason, message) for a pod that is not serving, from what the kubelet and controllers reported."""
    if info.terminating:
        return "Terminating", "the pod is being deleted"
    if info.sidecar_missing:
        key, value = INJECTION_LABEL
        return SIDECAR_MISSING, (
            f"annotated {SIDECAR_GROUP_ANNOTATION} but runs no {SIDECAR_CONTAINER} container: label the pod "
            f"{key}={value} (its namespace too) so that the injector adds it, and recreate it"
        )
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason and reason not in _STARTING:
            return reason, f"container {container.get('name')}: {waiting.get('message') or reason}"
    phase = status.get("phase") or "Pending"
    if phase != "Running":
        scheduled = conditions.get("PodScheduled") or {}
        if scheduled.get("status") == "False":
            return scheduled.get("reason") or "Unschedulable", scheduled.get("message") or "not scheduled"
        return phase, status.get("message") or status.get("reason") or f"phase {phase}"
    unready = [c.get("name", "") for c in statuses if not c.get("ready")]
    if unready:
        return "NotReady", f"containers not ready (readiness probe or restart): {', '.join(unready)}"
    gates = [g.get("conditionType") for g in spec.get("readinessGates") or []]
    pending = [g for g in gates if (conditions.get(g) or {}).get("status") != "True"]
    if pending:
        return "ReadinessGatesNotReady", f"readiness gates not passed: {', '.join(map(str, pending))}"
    # Ready=False with every container ready and no gate pending: the kubelet never reports
    # that; the node lifecycle controller does, for the pods of a node that stopped reporting.
    return "NodeNotReady", f"node {info.node_name or '?'} is not ready; its pods were marked not Ready"


LEASE_LAPSED = "MemberLeaseExpired"


def lease_lapsed(pods: Iterable[PodInfo], leases: MemberLeases, lease: float) -> list[PodInfo]:
    """``pods``, with those that would serve but whose member Lease lapsed (``lease`` seconds
    without a renewal seen) marked not serving: cut off from the API server, they serve nothing."""
    out = []
    for pod in pods:
        if pod.serving and leases.lapsed(pod.name, lease):
            message = f"its sidecar has not renewed its member Lease for leaseSeconds ({lease:g}s)"
            pod = replace(pod, lease_lapsed=True, reason=LEASE_LAPSED, message=message)
        out.append(pod)
    return out


APPLICATION_GONE = "ApplicationGone"


def application_gone(pods: Iterable[PodInfo], acks: Mapping[str, Ack], latest: int) -> list[PodInfo]:
    """``pods``, with those that would serve but whose sidecar said their application went away
    (an ``absent`` acknowledgement of generation ``latest``, the one published) marked not serving:
    like a RocketMQ broker that saw a consumer's channel close, the group goes on without it at once.
    It is counted in again once its sidecar serves a later generation and its application is back."""
    out = []
    for pod in pods:
        ack = acks.get(pod.name)
        if pod.serving and ack is not None and ack.absent and ack.generation >= latest:
            message = (
                f"its application's connections to the sidecar closed at generation {ack.generation} "
                "(it exited or crashed); counted in again when it connects"
            )
            pod = replace(pod, application_gone=True, reason=APPLICATION_GONE, message=message)
        out.append(pod)
    return out


def not_serving(pods: Iterable[PodInfo], selector: LabelSelector) -> list[PodInfo]:
    """Pods that match the selector but are not members, by name."""
    return sorted((p for p in pods if not p.serving and selector.matches(p.labels)), key=lambda p: p.name)


_LABEL_SETS: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}


def _shared_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    """One mapping for every pod with the same labels (the pods of a Deployment share theirs):
    thousands of pods keep a few dozen label sets, not one each. Never mutated."""
    key = tuple(sorted(labels.items()))
    shared = _LABEL_SETS.get(key)
    if shared is None:
        shared = _LABEL_SETS[key] = MappingProxyType({sys.intern(k): sys.intern(v) for k, v in key})
    return shared


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


class PodIndex:
    """The pods the operator sees, by namespace and by ``key=value`` label pair.

    A group's selector usually has matchLabels; then only the pods carrying its rarest
    pair can match, and a reconcile looks at those instead of every pod of the namespace.
    """

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, PodInfo]] = {}
        self._by_label: dict[str, dict[tuple[str, str], set[str]]] = {}

    def get(self, namespace: str, name: str) -> PodInfo | None:
        return self._pods.get(namespace, {}).get(name)

    def put(self, namespace: str, info: PodInfo) -> PodInfo | None:
        """Add or replace a pod; the one it replaced."""
        old = self.remove(namespace, info.name)
        self._pods.setdefault(namespace, {})[info.name] = info
        by_label = self._by_label.setdefault(namespace, {})
        for pair in info.labels.items():
            by_label.setdefault(pair, set()).add(info.name)
        return old

    def remove(self, namespace: str, name: str) -> PodInfo | None:
        pods = self._pods.get(namespace)
        old = pods.pop(name, None) if pods is not None else None
        if old is None:
            return None
        by_label = self._by_label[namespace]
        for pair in old.labels.items():
            names = by_label.get(pair)
            if names is not None:
                names.discard(name)
                if not names:
                    del by_label[pair]
        if not pods:
            del self._pods[namespace]
            del self._by_label[namespace]
        return old

    def forget(self, namespace: str) -> None:
        """Drop every pod of ``namespace`` (no longer watched here)."""
        self._pods.pop(namespace, None)
        self._by_label.pop(namespace, None)

    def candidates(self, namespace: str, selector: LabelSelector | None) -> list[PodInfo]:
        """Pods of the namespace that may match ``selector`` (all of them without matchLabels), by name.

        A superset of the matching pods: callers still apply the selector.
        """
        pods = self._pods.get(namespace, {})
        if selector is None or not selector.match_labels:
            return [pods[n] for n in sorted(pods)]
        by_label = self._by_label.get(namespace, {})
        rarest = min((by_label.get(pair, set()) for pair in selector.match_labels.items()), key=len)
        return [pods[n] for n in sorted(rarest)]

    def __len__(self) -> int:
        return sum(len(p) for p in self._pods.values())
