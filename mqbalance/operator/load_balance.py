"""STICKY with ``load``: the assignment that evens out the measured rates, for one reconcile, and
what a group keeps of them between reconciles (:class:`LoadTracker`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from mqbalance.model import Assignment, MessageQueue, Zones
from mqbalance.operator.observation import Observed, Outcome
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


NO_STREAK = LoadState()
"""The hysteresis state with no imbalance counted (one object for every group)."""


@dataclass(slots=True, eq=False)
class LoadTracker:
    """One group's measured rates and the load-aware strategy's hysteresis, between reconciles: the
    lag loop hands rates in (:meth:`take`), each reconcile reads them (:meth:`observed`) and keeps
    what it decided (:meth:`keep`). A group balanced otherwise keeps none."""

    aware: bool = False
    """Its strategy is STICKY with ``load`` (CLUSTERING), as of the last reconcile: new rates reconcile it."""
    rates: dict[MessageQueue, float] | None = None
    """Each queue's produce rate from the lag loop's last two readings."""
    sample: int = 0
    """Counts the rates handed in: a reconcile advances the hysteresis once per sample."""
    counted: int = 0
    """The sample ``state`` has counted."""
    base: LoadState = NO_STREAK
    """The hysteresis state before that sample: a reconcile of the same sample starts from it again."""
    state: LoadState = NO_STREAK
    target: dict[str, tuple[MessageQueue, ...]] | None = None
    """The assignment the load-aware strategy last computed (where queues in a handover go)."""

    def take(self, rates: Mapping[MessageQueue, float]) -> bool:
        """New per-queue produce rates; whether the group balances by them (then it reconciles)."""
        if not self.aware:
            self.rates = None
            return False
        self.rates = dict(rates)
        self.sample += 1
        return True

    def observed(
        self,
    ) -> tuple[dict[MessageQueue, float] | None, LoadState, dict[str, tuple[MessageQueue, ...]] | None]:
        """The rates, hysteresis state and target a reconcile reads. The hysteresis counts lag
        readings, not reconciles: a reconcile of a sample already counted starts again from the
        state before it."""
        fresh = self.rates is not None and self.sample != self.counted
        return self.rates, self.state if fresh else self.base, self.target

    def keep(self, outcome: Outcome) -> None:
        """Keep the hysteresis and target a reconcile computed; forget them when load is not set."""
        if outcome.invalid:
            return  # nothing is published while invalid: what was measured stays for when it is valid
        if outcome.load_target is None:  # not STICKY with load (or BROADCASTING)
            self.aware = False
            self.rates = self.target = None
            self.base = self.state = NO_STREAK
            self.counted = self.sample
            return
        self.aware = True
        self.target = dict(outcome.load_target)
        if outcome.load_state is not None:
            if self.counted != self.sample:  # this reconcile counted a new sample
                self.base = self.state
                self.counted = self.sample
            self.state = outcome.load_state
