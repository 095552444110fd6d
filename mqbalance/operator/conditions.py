"""Kubernetes-style status conditions (``metav1.Condition``), kept in a fixed order per kind of resource."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: str,
    reason: str,
    message: str,
    now: float,
    observed_generation: int,
    order: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Conditions with ``kind`` set, sorted by ``order``; lastTransitionTime changes only when its
    status does (so an unchanged condition writes nothing)."""
    old = next((c for c in conditions if c.get("type") == kind), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    new = {
        "type": kind,
        "status": status,
        "reason": reason,
        "lastTransitionTime": since or rfc3339(now),
        "observedGeneration": observed_generation,
    }
    if message:  # omitted when empty, as Kubernetes does (this API server also reads "" as null)
        new["message"] = message
    rest = [c for c in conditions if c.get("type") != kind]

    def rank(c: Mapping[str, Any]) -> int:
        kind = c.get("type", "")
        return order.index(kind) if kind in order else len(order)

    return sorted([*rest, new], key=rank)


def condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def condition_status(status: Mapping[str, Any], kind: str) -> str | None:
    c = condition(status, kind)
    return c.get("status") if c else None


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
