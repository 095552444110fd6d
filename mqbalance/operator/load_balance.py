"""STICKY with ``load``: the assignment that evens out the measured rates, for one reconcile."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from mqbalance.model import Assignment, MessageQueue, Zones
from mqbalance.operator.observation import Observed
from mqbalance.operator.spec import GroupSpec
from mqbalance.strategies import LoadState, allocate_group, balance_group


def balance_by_load(
    obs: Observed,
    spec: GroupSpec,
    topics: Mapping[str, Sequence[MessageQueue]],
    member_zones: Mapping[str, str],
    zones: Zones,
    previous: Assignment | None,
) -> tuple[dict[str, dict[str, tuple[MessageQueue, ...]]], LoadState | None]:
    """STICKY with ``load``: the assignment, and the hysteresis state after ``obs.loads`` (None
    without rates: the state stays as it was)."""
    if previous is not None and obs.previous is not None and obs.previous.releasing and obs.load_target:
        # A handover under way: its revoked queues count where the last balancing sent them, so
        # that the balancing sees its own move and does not undo it.
        going = {mq: m for m, qs in obs.load_target.items() if m in member_zones for mq in qs}
        revoked = {mq for r in obs.previous.releasing for mq in r.queues}
        moved = {mq: going[mq] for mq in revoked if mq in going}
        previous = {
            m: tuple(mq for mq in qs if mq not in moved) + tuple(q for q, to in moved.items() if to == m)
            for m, qs in previous.items()
        }
    if obs.loads is not None:
        return balance_group(
            spec.strategy,
            topics,
            member_zones,
            loads=obs.loads,
            state=obs.load_state,
            zones=zones,
            previous=previous,
            message_model=spec.message_model,
        )
    everything = {mq for qs in topics.values() for mq in qs}
    held = {mq for qs in (previous or {}).values() for mq in qs}
    if previous is not None and set(previous) == set(member_zones) and held == everything:
        # Nothing to rebalance for: keep what is held (zero loads move nothing but the count bounds).
        kept, _ = balance_group(
            spec.strategy,
            topics,
            member_zones,
            loads={},
            zones=zones,
            previous=previous,
            message_model=spec.message_model,
        )
        return kept, None
    plain = replace(spec.strategy, load=None)
    return (
        allocate_group(
            plain, topics, member_zones, zones=zones, previous=previous, message_model=spec.message_model
        ),
        None,
    )
