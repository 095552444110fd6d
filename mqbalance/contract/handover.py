"""``spec.handover`` of a ConsumerGroup: how queues change owner, and its one reader.

The operator runs the handover (``mqbalance.operator.handover``); the published document names
its mode and lease terms, which the sidecar serves and enforces.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqbalance.contract.errors import SpecError
from mqbalance.model import MessageModel


class HandoverMode(enum.StrEnum):
    OFF = "Off"
    """One step: a queue goes to its new owner in the same generation that takes it away."""
    RELEASE = "Release"
    """Revoke, wait for the release (at most the timeout), then assign."""
    ORDERLY = "Orderly"
    """As Release, but an override also waits for the broker lock to expire or the pod to go."""


DEFAULT_RELEASE_TIMEOUT = 30.0
DEFAULT_BROKER_LOCK = 60.0
"""RocketMQ's broker-side lock lifetime (``REBALANCE_LOCK_MAX_LIVE_TIME``), in seconds."""
DEFAULT_LEASE = 20.0
"""How long a member's grant lasts without a confirmed renewal, in seconds."""
DEFAULT_RENEW = 5.0
"""How often a member's sidecar renews its Lease, in seconds."""
DEFAULT_LEASE_MARGIN = 5.0
"""What the operator adds to ``leaseSeconds`` for the drift between its clock and the sidecar's."""
LEASE_RENEWALS = 2
"""spec.handover.leaseSeconds must be at least this many renewSeconds (a renewal may fail or be late)."""


@dataclass(frozen=True)
class HandoverSpec:
    """``spec.handover``, defaults filled in."""

    mode: HandoverMode = HandoverMode.OFF
    release_timeout: float = DEFAULT_RELEASE_TIMEOUT
    broker_lock: float = DEFAULT_BROKER_LOCK
    lease: float = DEFAULT_LEASE
    """``leaseSeconds``: a member's sidecar stops serving its queues this long after its last
    confirmed renewal (Release and Orderly only)."""
    renew: float = DEFAULT_RENEW
    """``renewSeconds``: how often the sidecar renews."""
    lease_margin: float = DEFAULT_LEASE_MARGIN
    """``leaseMarginSeconds``: added to ``lease`` for clock drift before anything is handed on."""

    @property
    def leased(self) -> bool:
        """Whether members hold time-bounded grants (every mode but Off)."""
        return self.mode is not HandoverMode.OFF

    def expired_at(self, since: float) -> float:
        """When every grant confirmed before ``since`` has surely expired: an owner cut off from
        the API server since then serves nothing any more (Off: at once, there are no grants)."""
        return since + (self.lease + self.lease_margin if self.leased else 0.0)

    def override_at(self, since: float) -> float:
        """When a revocation that nobody acknowledged may be overridden (if its owner still runs):
        at the release timeout, never before the grants have expired, and in Orderly mode not
        before the broker lock either."""
        wait = self.release_timeout
        if self.mode is HandoverMode.ORDERLY:
            wait = max(wait, self.broker_lock)
        return max(since + wait, self.expired_at(since))


def read_handover(data: Any, model: MessageModel) -> HandoverSpec:
    """``spec.handover``: how queues change owner (Off, the default, keeps the one-step hand-over)."""
    if not isinstance(data, Mapping):
        raise SpecError("spec.handover must be an object with a mode (Off, Release or Orderly)")
    try:
        mode = HandoverMode(data.get("mode") or HandoverMode.OFF)
    except ValueError:
        raise SpecError(f"spec.handover.mode is {data.get('mode')!r}; use Off, Release or Orderly") from None
    if mode is not HandoverMode.OFF and model is MessageModel.BROADCASTING:
        raise SpecError(
            "spec.handover.mode applies to CLUSTERING only (in BROADCASTING every member holds every queue); "
            "set it to Off"
        )
    values = []
    for key, default, low, high in (
        ("releaseTimeoutSeconds", DEFAULT_RELEASE_TIMEOUT, 1, 3600),
        ("brokerLockSeconds", DEFAULT_BROKER_LOCK, 0, 3600),
        ("leaseSeconds", DEFAULT_LEASE, 1, 3600),
        ("renewSeconds", DEFAULT_RENEW, 1, 1800),
    ):
        value = data.get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
            raise SpecError(
                f"spec.handover.{key} is {value!r}; use a number of seconds from {low:g} to {high}"
            )
        values.append(float(value))
    timeout, lock, lease, renew = values
    margin = data.get("leaseMarginSeconds", DEFAULT_LEASE_MARGIN)
    if not isinstance(margin, int | float) or isinstance(margin, bool) or not 0 < margin <= 600:
        raise SpecError(
            f"spec.handover.leaseMarginSeconds is {margin!r}; use a number of seconds more than 0 and "
            "at most 600: it covers the drift between the operator's and the sidecars' clocks (5 by default)"
        )
    if lease < LEASE_RENEWALS * renew:
        raise SpecError(
            f"spec.handover.leaseSeconds ({lease:g}) must be at least {LEASE_RENEWALS} x renewSeconds "
            f"({renew:g}), so that one late or failed renewal does not stop a healthy member: "
            f"raise leaseSeconds to {LEASE_RENEWALS * renew:g} or more, or lower renewSeconds"
        )
    return HandoverSpec(mode, timeout, lock, lease, renew, float(margin))
