"""The lag loop: every group's offsets read from its brokers on an interval of its own.

A source, as the informers are, off the reconcile path: a task of its own reads each group's
offsets (:mod:`offsets`), computes its lag per queue, per member of the published assignment and
in total, and the consume and produce rates from the sample before, and records the reading in the
world (``World.record_lag``; the produce rate of each queue also goes to the groups whose STICKY
balances load: ``World.record_rates``), which queues the group when the reading says something new.
The group reconciler, the one writer of a group's status, writes ``status.lag`` and the
``LagAvailable`` condition from it. A broker that cannot be reached or refuses the query never
fails or delays a reconcile: the figures of the brokers that answered are shown, the condition
says which did not and why, and the published assignment stays as it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqbalance.contract import AssignmentDocument, DocumentError
from mqbalance.lag import (
    DEFAULT_DRAIN_SECONDS,
    GroupLag,
    Rates,
    Sample,
    group_lag,
    member_capacity,
    most_behind,
    rates,
    recommended_members,
)
from mqbalance.model import Assignment, MessageModel, MessageQueue
from mqbalance.operator.conditions import rfc3339
from mqbalance.operator.metrics import LagFigures, OperatorMetrics
from mqbalance.operator.observation import LagReading
from mqbalance.operator.offsets import BrokerFailure, OffsetReader
from mqbalance.operator.status import LAG_CONDITION
from mqbalance.operator.world import CachedGroup, World

logger = logging.getLogger("mqbalance.operator")

__all__ = ["LAG_CONDITION", "LagPoller", "LagSettings", "lag_condition", "lag_status"]

DEFAULT_INTERVAL = 30.0
"""Seconds between two readings of a group's offsets."""
MOST_BEHIND = 5
"""Members listed in status.lag.mostBehind."""
GROUPS_AT_ONCE = 16
"""Groups whose offsets are read at the same time (the token bucket paces the requests anyway)."""


@dataclass(frozen=True)
class LagSettings:
    interval: float = DEFAULT_INTERVAL
    """Seconds between readings; 0 turns the loop off."""
    per_queue_metrics: bool = False
    """Export mqbalance_queue_lag (one series per queue: many)."""
    most_behind: int = MOST_BEHIND
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    """The time status.lag.recommendedMembers allows for consuming the backlog."""


def queue_rates(previous: Sample | None, current: Sample) -> dict[MessageQueue, float] | None:
    """Each queue's produce rate (messages stored a second) between two samples, over the queues
    read both times; a max offset that went backwards counts 0. None without an earlier sample.

    The produce rate, not the consume rate, is a queue's load: it is the traffic its owner must
    keep up with, whoever owns it. The consume rate is capped by how fast the present owner
    consumes, so a queue whose owner falls behind would look lighter than it is, and moving it
    would change its rate."""
    if previous is None or current.time <= previous.time:
        return None
    seconds = current.time - previous.time
    out = {}
    for queue, now in current.offsets.items():
        before = previous.offsets.get(queue)
        if before is not None:
            out[queue] = max(0, now.broker_offset - before.broker_offset) / seconds
    return out


def load_spread(rates: Mapping[MessageQueue, float], topics: Mapping[str, Assignment]) -> float | None:
    """The busiest member's rate over the mean member's (1 is even); None with no traffic."""
    loads: dict[str, float] = {}
    for assignment in topics.values():
        for member, held in assignment.items():
            loads[member] = loads.get(member, 0.0) + sum(rates.get(q, 0.0) for q in held)
    total = sum(loads.values())
    if not loads or total <= 0:
        return None
    return max(loads.values()) / (total / len(loads))


def lag_status(
    lag: GroupLag,
    rate: Rates | None,
    failures: Sequence[BrokerFailure],
    now: float,
    limit: int,
    spread: float | None = None,
    recommended: int | None = None,
    capacity: float | None = None,
) -> dict[str, Any]:
    """``status.lag``: totals, rates, the members furthest behind (at most ``limit``), the
    recommended member count and the per-member consume rate it was computed from."""
    status: dict[str, Any] = {
        "total": lag.total,
        "queues": lag.queues,
        "mostBehind": [
            {"member": m.member, "lag": m.lag, "queues": m.queues} for m in most_behind(lag, limit)
        ],
        "sampledAt": rfc3339(now),
    }
    if lag.unowned:
        status["unowned"] = lag.unowned
    if rate is not None:
        # Whole messages a second are plenty for a status; the metrics carry the exact rate.
        status["consumeRate"] = round(rate.consume, 1)
        status["produceRate"] = round(rate.produce, 1)
    if spread is not None:
        status["loadSpread"] = round(spread, 2)
    if recommended is not None:
        status["recommendedMembers"] = recommended
    if capacity is not None:
        status["memberConsumeRate"] = round(capacity, 1)
    if failures:
        status["brokersUnavailable"] = sorted({f.broker or f.topic for f in failures})
    return status


def lag_condition(failures: Sequence[BrokerFailure], read_queues: int) -> tuple[str, str, str]:
    """(status, reason, message) of the LagAvailable condition."""
    if not failures:
        return "True", "OffsetsRead", f"offsets of {read_queues} queues read from their brokers"
    reason = failures[0].reason
    shown = "; ".join(f.message for f in failures[:3])
    more = f"; and {len(failures) - 3} more" if len(failures) > 3 else ""
    partial = f"lag counts only the {read_queues} queues read" if read_queues else "no offsets read"
    return "False", reason, f"{shown}{more}; {partial}; the assignment stays as published"


@dataclass(eq=False)
class LagPoller:
    """Reads every group's offsets each ``settings.interval`` seconds and records them in the world."""

    world: World
    reader: OffsetReader
    settings: LagSettings
    metrics: OperatorMetrics
    owns: Callable[[str, str], bool] = lambda namespace, name: True
    """Whether this replica works on a group (sharding: its shard is held here)."""
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    samples: dict[tuple[str, str], Sample] = field(default_factory=dict, init=False)
    capacity: dict[tuple[str, str], float] = field(default_factory=dict, init=False)
    """Each group's last measured per-member consume rate (lag.member_capacity)."""
    _documents: dict[tuple[str, str], tuple[str | None, AssignmentDocument]] = field(
        default_factory=dict, init=False
    )
    rounds: int = field(default=0, init=False)
    """Rounds over every group completed."""

    async def run(self) -> None:
        """Until cancelled: a round over every group, then wait out the rest of the interval."""
        await self.world.synced.wait()
        while True:
            started = self.monotonic()
            try:
                await self.poll_once()
            except Exception:  # never let the loop die; the next round tries again
                logger.exception("reading the groups' lag failed")
            self.rounds += 1
            await asyncio.sleep(max(0.0, self.settings.interval - (self.monotonic() - started)))

    async def poll_once(self) -> None:
        groups = [g for key, g in list(self.world.groups.items()) if self.owns(*key)]
        keys = {(g.namespace, g.name) for g in groups}
        for gone in set(self.samples) - keys:
            del self.samples[gone]
        for gone in set(self.capacity) - keys:
            del self.capacity[gone]
        for gone in set(self._documents) - keys:
            del self._documents[gone]
        self.reader.begin_round()
        limit = asyncio.Semaphore(GROUPS_AT_ONCE)

        async def one(group: CachedGroup) -> None:
            async with limit:
                await self.poll_group(group)

        await asyncio.gather(*(one(g) for g in groups))

    async def poll_group(self, group: CachedGroup) -> None:
        key = (group.namespace, group.name)
        document = self._document(group)
        if document is None or document.message_model is MessageModel.BROADCASTING:
            # Nothing published yet: no member to split the lag by. Broadcasting consumers keep
            # their offsets locally, so the broker's figures mean nothing for them.
            return
        topics = self.world.lag_topics(group, list(document.topics))
        named = any(addresses for _, addresses in topics)
        if not topics or (not named and not self.reader.default_name_server):
            return  # no NameServer to ask: lag is not measured for this group
        secrets = self.world.lag_secrets(group, [topic for topic, _ in topics])
        credentials = {t: await self.reader.credentials(group.namespace, s, t) for t, s in secrets.items()}
        read = await self.reader.read_group(document.group, topics, credentials)
        self.metrics.observe_lag_read(read.requests, [f.reason for f in read.failures])
        sample = Sample(self.monotonic(), read.offsets)
        before = self.samples.get(key)
        rate = rates(before, sample) if not read.failures else None
        per_queue = queue_rates(before, sample) if not read.failures else None
        if read.offsets and not read.failures:
            self.samples[key] = sample
        lag = group_lag(read.offsets, document.topics)
        spread = load_spread(per_queue, document.topics) if per_queue is not None else None
        recommended: int | None = None
        if rate is not None:  # no recommendation without two whole readings: an autoscaler then holds
            measured = member_capacity(before, sample, document.topics)
            if measured is not None:
                self.capacity[key] = measured
            recommended = recommended_members(
                queues=lag.queues,
                members=len(lag.members),
                lag=lag.total,
                produce_rate=rate.produce,
                capacity=self.capacity.get(key),
                drain_seconds=self.settings.drain_seconds,
            )
        status = lag_status(
            lag,
            rate,
            read.failures,
            self.clock(),
            self.settings.most_behind,
            spread,
            recommended,
            self.capacity.get(key) if recommended is not None else None,
        )
        condition = lag_condition(read.failures, lag.queues)
        figures = LagFigures(
            total=lag.total,
            consume_rate=rate.consume if rate else None,
            produce_rate=rate.produce if rate else None,
            members=tuple((m.member, m.lag) for m in lag.members),
            queues=tuple((q, o.lag) for q, o in sorted(read.offsets.items()))
            if self.settings.per_queue_metrics
            else (),
            available=not read.failures,
            load_spread=spread,
            recommended_members=recommended,
        )
        if self.world.record_lag(group, LagReading(status, condition), figures):
            if condition[0] == "True":
                logger.info("%s/%s: lag read from every broker again", group.namespace, group.name)
            else:
                logger.warning("%s/%s: lag partly unknown: %s", group.namespace, group.name, condition[2])
        if per_queue is not None:
            self.world.record_rates(group, per_queue)  # a group balanced by load reconciles with them

    def _document(self, group: CachedGroup) -> AssignmentDocument | None:
        """The published document, decoded once per version."""
        published = group.publication.configmap
        key = (group.namespace, group.name)
        if published is None or published.text is None:
            cached = self._documents.get(key)
            return cached[1] if cached else None
        cached = self._documents.get(key)
        if cached is not None and cached[0] == published.resource_version:
            return cached[1]
        try:
            document = AssignmentDocument.decode(published.text)
        except DocumentError:
            return None
        self._documents[key] = (published.resource_version, document)
        return document
