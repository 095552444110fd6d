"""The OffsetReset reconciler: reads the brokers, moves a reset through its phases, writes its status.

The decisions are offset_reset.py's; here are the reads and writes: the group and its Topics from
the world, each queue's min, max and committed offset from its broker (mqbalance.rocketmq.admin:
GET_MIN_OFFSET, GET_MAX_OFFSET, QUERY_CONSUMER_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, and
UPDATE_CONSUMER_OFFSET to write, the requests of RocketMQ's own admin tools), the status and Events.
The group is held paused by the world (``World.pause_holds``) while the reset's phase holds it, so
the group reconciler, the one writer of the group, does the pausing and the resuming.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mqbalance.contract import (
    APPROVE_ANNOTATION,
    OFFSET_RESET_KIND,
    OFFSET_RESETS,
    SpecError,
    read_topic_spec,
)
from mqbalance.kube import ApiError
from mqbalance.operator.conditions import condition
from mqbalance.operator.metrics import OperatorMetrics
from mqbalance.operator.offset_reset import (
    ACTIVE,
    FAILED,
    PAUSING,
    PHASE_RANK,
    PROPOSED,
    SUCCEEDED,
    VERIFYING,
    WRITING,
    QueueKey,
    QueueReading,
    ResetRefused,
    ResetSpec,
    ResetTarget,
    advanced,
    changed,
    check_size,
    drifted,
    finished,
    hold_reason,
    preview_rows,
    proposed,
    queue_name,
    read_reset_spec,
    reset_topics,
    resolve_targets,
    retrying,
    row_key,
    totals,
)
from mqbalance.operator.offsets import BrokerFailure, OffsetReader, broker_address
from mqbalance.operator.spec import parse_group
from mqbalance.operator.world import World, reset_group
from mqbalance.operator.writes import Writer, merge_patch
from mqbalance.rocketmq.admin import AdminError, BrokerAdmin, QueueRef
from mqbalance.rocketmq.remoting import Credentials

logger = logging.getLogger("mqbalance.operator")

T = TypeVar("T")
QUEUES_AT_ONCE = 16
"""Broker requests of one reset in flight at once."""
SETTLE_SECONDS = 6.0
"""The committed offsets must stay still this long once the group is paused: longer than the
interval at which RocketMQ's consumers commit their offsets (5 s)."""
SETTLE_TIMES = 5
"""Readings that found them moving before the reset fails."""
RETRY_SECONDS = 5.0
"""A broker that did not answer is asked again this much later (the phase stays)."""


class BrokersUnavailable(Exception):
    """A route or a broker could not be read now; the same phase is tried again later."""


@dataclass(frozen=True)
class Queues:
    """Where each queue of the reset is served, and how to sign requests to its broker."""

    refs: Mapping[QueueKey, QueueRef]
    credentials: Mapping[str, Credentials | None]
    """Topic resource -> the credentials its broker requests are signed with."""


@dataclass(frozen=True)
class Settling:
    committed: Mapping[QueueKey, int | None]
    since: float
    times: int


@dataclass(eq=False)
class ResetReconciler:
    world: World
    writer: Writer
    metrics: OperatorMetrics
    reader: OffsetReader
    clock: Callable[[], float]
    timeout: float = 3.0
    _settling: dict[tuple[str, str], Settling] = field(default_factory=dict)
    """Resets in Verifying: the committed offsets last read and since when they stayed so."""
    _written: dict[tuple[str, str], tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    """(namespace, name) -> (uid, the status last written): newer than the cache until the watch
    brings it back, so a reset woken meanwhile never repeats a phase it finished."""

    async def work(self, namespace: str, name: str) -> None:
        body = self.world.resets.get((namespace, name))
        if body is None:  # deleted: what was kept of it goes too
            self._written.pop((namespace, name), None)
            self._settling.pop((namespace, name), None)
            return
        status = self._status(namespace, name, body)
        if status.get("phase") in (SUCCEEDED, FAILED):
            return
        generation = int(body["metadata"].get("generation") or 0)
        try:
            new = await self._step(body, status, generation)
        except ResetRefused as e:
            new = finished(status, False, e.reason, e.message, self.clock(), generation)
        except BrokersUnavailable as e:
            message = f"{e}; trying again in {RETRY_SECONDS:g}s"
            logger.warning("OffsetReset %s/%s: %s", namespace, name, message)
            self.world.queue.add_after(("reset", namespace, name), RETRY_SECONDS)
            new = retrying(status, message, self.clock(), generation)
        if new != status:
            await self._write(body, status, new)

    def _status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        cached = body.get("status") or {}
        written = self._written.get((namespace, name))
        if written is None or written[0] != body["metadata"].get("uid"):
            return cached
        rank = PHASE_RANK.get(str(written[1].get("phase")), -1)
        return written[1] if rank > PHASE_RANK.get(str(cached.get("phase")), -1) else cached

    async def _step(
        self, body: Mapping[str, Any], status: Mapping[str, Any], generation: int
    ) -> dict[str, Any]:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        phase = status.get("phase")
        reset = read_reset_spec(body.get("spec"))
        group = self.world.groups.get((namespace, reset.group))
        if group is None:
            raise ResetRefused("GroupNotFound", f"no ConsumerGroup {reset.group} in namespace {namespace}")
        try:
            spec = parse_group(reset.group, group.body.get("spec"))
        except SpecError as e:
            raise ResetRefused("GroupInvalid", f"ConsumerGroup {reset.group} cannot be read: {e}") from None
        topics = reset_topics(reset, spec)
        now = self.clock()
        if not phase:
            self._refuse_second(namespace, name, body, reset)
            queues = await self._locate(namespace, topics)
            check_size(len(queues.refs))
            readings = await self._read(spec.group_name, queues)
            targets = resolve_targets(
                reset.target,
                readings,
                await self._searched(reset, queues),
                await self._source(namespace, reset, queues),
            )
            rows = preview_rows(readings, targets)
            paused = bool((group.body.get("status") or {}).get("pausedBy"))
            self._event(body, "Normal", "Previewed", _summary(rows, "would be"))
            return proposed(status, spec.group_name, rows, paused, name, now, generation)
        if phase == PROPOSED:
            if (meta.get("annotations") or {}).get(APPROVE_ANNOTATION) != "true":
                return dict(status)
            self._event(body, "Normal", "Approved", f"pausing group {reset.group} to reset its offsets")
            return advanced(
                status, PAUSING, f"waiting for group {reset.group} to let go of every queue", now, generation
            )
        if phase == PAUSING:
            group_status = group.body.get("status") or {}
            pause = condition(group_status, "Paused")
            if (
                hold_reason(name) not in (group_status.get("pausedBy") or [])
                or pause is None
                or pause.get("status") != "True"
            ):
                return dict(status)  # woken again when the group's status changes
            return advanced(status, VERIFYING, "reading the committed offsets again", now, generation)
        rows = list(status.get("queues") or [])
        queues = await self._locate(namespace, tuple(dict.fromkeys(str(r["topic"]) for r in rows)))
        keys = [row_key(r) for r in rows]
        if phase == VERIFYING:
            readings = await self._read(spec.group_name, queues, keys)
            moved = drifted(
                rows, {k: r.committed for k, r in readings.items()}, status.get("pausedAtPreview") is True
            )
            if moved:
                raise ResetRefused(
                    "OffsetsDrifted",
                    "committed offsets changed since the preview, not by the group's consumption: "
                    f"{', '.join(moved)}; "
                    "nothing was written (create a new OffsetReset for a new preview)",
                )
            if not self._still(namespace, name, {k: r.committed for k, r in readings.items()}):
                return dict(status)  # read again once they had a commit interval to move
            # Targets that move with the queue are read now, the group paused; the others are the
            # preview's, checked against the queue's ends again (old messages may have gone meanwhile).
            fixed = ResetTarget(offsets={row_key(r): int(r["target"]) for r in rows})
            target = reset.target if reset.target.moves_with_queue else fixed
            source = await self._source(namespace, reset, queues, keys)
            rows = preview_rows(readings, resolve_targets(target, readings, None, source))
            writing = advanced(status, WRITING, "writing the offsets to the brokers", now, generation)
            return {**writing, "queues": rows, "totals": totals(rows)}
        if phase == WRITING:
            await self._commit(spec.group_name, queues, rows)
            readings = await self._read(spec.group_name, queues, keys)
            wrong = [
                f"{queue_name(row_key(r))} ({readings[row_key(r)].committed} not {r['target']})"
                for r in rows
                if readings[row_key(r)].committed != r["target"]
            ]
            if wrong:
                raise ResetRefused(
                    "NotConfirmed", f"brokers read back other offsets than written: {', '.join(wrong)}"
                )
            after = "left paused until this reset is deleted" if reset.leave_paused else "resumed"
            message = _summary(rows, "were") + f"; group {reset.group} {after}"
            self._event(body, "Normal", "Succeeded", message)
            return finished(status, True, "Succeeded", message, now, generation)
        return dict(status)

    def _still(self, namespace: str, name: str, committed: Mapping[QueueKey, int | None]) -> bool:
        """Whether the committed offsets stayed as they are for SETTLE_SECONDS (read again until they
        did, at most SETTLE_TIMES): a consumer that still holds a queue commits its offset every 5 s
        (RocketMQ's persistConsumerOffsetInterval), and would commit it over the reset."""
        key = (namespace, name)
        now = self.world.queue.timer.now()
        settle = self._settling.get(key)
        if settle is not None and settle.committed == committed:
            if now - settle.since >= SETTLE_SECONDS:
                del self._settling[key]
                return True
            self.world.queue.add_after(("reset", *key), SETTLE_SECONDS - (now - settle.since))
            return False
        times = 0 if settle is None else settle.times + 1
        if times >= SETTLE_TIMES:
            del self._settling[key]
            moving = changed(settle.committed if settle else {}, committed)
            raise ResetRefused(
                "OffsetsStillMoving",
                f"committed offsets kept changing with the group paused: {', '.join(moving)}; a consumer "
                "the pause does not reach (one outside mqbalance, or whose sidecar is away) still commits "
                "to this group: stop it and create a new OffsetReset",
            )
        self._settling[key] = Settling(dict(committed), now, times)
        self.world.queue.add_after(("reset", *key), SETTLE_SECONDS)
        return False

    def _refuse_second(self, namespace: str, name: str, body: Mapping[str, Any], reset: ResetSpec) -> None:
        """A reset of a group another reset is under way for (created earlier) is refused."""
        mine = (str(body["metadata"].get("creationTimestamp") or ""), name)
        for other in self.world.resets_of(namespace, reset.group):
            other_name = other["metadata"]["name"]
            phase = (other.get("status") or {}).get("phase")
            if other_name == name or (phase and phase not in ACTIVE):
                continue  # itself, or over (one not worked on yet counts as under way)
            if (str(other["metadata"].get("creationTimestamp") or ""), other_name) < mine:
                raise ResetRefused(
                    "ResetInProgress",
                    f"OffsetReset {other_name} of group {reset.group} is under way; "
                    "wait for it to end or delete it",
                )

    async def _locate(self, namespace: str, topics: Sequence[str]) -> Queues:
        """Each readable queue of the Topics from their route, with its broker's address."""
        refs: dict[QueueKey, QueueRef] = {}
        signers: dict[str, Credentials | None] = {}
        specs = self.world.topic_specs.get(namespace, {})
        for resource in topics:
            if resource not in specs:
                raise ResetRefused("TopicNotFound", f"no Topic {resource} in namespace {namespace}")
            topic = read_topic_spec(resource, specs[resource])
            addresses = list(topic.name_server.addresses) if topic.name_server is not None else []
            signers[resource] = None
            if topic.name_server is not None and topic.name_server.acl_secret:
                got = await self.reader.credentials(namespace, topic.name_server.acl_secret, topic.topic_name)
                if not isinstance(got, Credentials):
                    raise BrokersUnavailable(got.message)
                signers[resource] = got
            self.reader.begin_round()  # the route as it is now, not as a lag round read it
            route = await self.reader.route(topic.topic_name, addresses)
            if isinstance(route, BrokerFailure):
                if route.reason == "NoNameServer":
                    raise ResetRefused(
                        "NoNameServer",
                        f"{route.message}: name one in Topic {resource}'s spec.nameServer, or start the "
                        "operator with --name-server, to find the brokers of its queues",
                    )
                raise BrokersUnavailable(route.message)
            for data in route.queue_datas:
                broker = route.broker(data.broker_name)
                address = broker_address(broker.addresses) if broker is not None else None
                if address is None:
                    raise BrokersUnavailable(f"broker {data.broker_name}: the route names no address for it")
                for queue_id in range(data.read_queue_nums):
                    refs[(resource, data.broker_name, queue_id)] = QueueRef(
                        address, topic.topic_name, queue_id
                    )
        return Queues(refs, signers)

    async def _each(
        self,
        queues: Queues,
        keys: Sequence[QueueKey],
        call: Callable[[BrokerAdmin, QueueRef, QueueKey], Awaitable[T]],
    ) -> list[T]:
        """``call`` for each queue of ``keys``, at most QUEUES_AT_ONCE at a time."""
        limit = asyncio.Semaphore(QUEUES_AT_ONCE)

        async def one(key: QueueKey) -> T:
            if key not in queues.refs:
                raise BrokersUnavailable(f"queue {queue_name(key)} is no longer in its topic's route")
            async with limit:
                return await call(
                    BrokerAdmin(self.timeout, queues.credentials.get(key[0])), queues.refs[key], key
                )

        try:
            return list(await asyncio.gather(*(one(k) for k in keys)))
        except AdminError as e:
            raise BrokersUnavailable(str(e)) from None

    async def _read(
        self, group: str, queues: Queues, keys: Sequence[QueueKey] | None = None
    ) -> dict[QueueKey, QueueReading]:
        keys = list(queues.refs) if keys is None else list(keys)

        async def read(admin: BrokerAdmin, ref: QueueRef, _: QueueKey) -> QueueReading:
            low, high = await admin.min_offset(ref), await admin.max_offset(ref)
            return QueueReading(low, high, await admin.committed_offset(group, ref))

        return dict(zip(keys, await self._each(queues, keys, read), strict=True))

    async def _searched(self, reset: ResetSpec, queues: Queues) -> dict[QueueKey, int] | None:
        when = reset.target.time_ms
        if when is None:
            return None
        keys = list(queues.refs)
        found = await self._each(queues, keys, lambda admin, ref, _: admin.search_offset(ref, when))
        return dict(zip(keys, found, strict=True))

    async def _source(
        self, namespace: str, reset: ResetSpec, queues: Queues, keys: Sequence[QueueKey] | None = None
    ) -> dict[QueueKey, int | None] | None:
        """The committed offsets of ``to.fromGroup`` (a ConsumerGroup here) on the same queues."""
        source = reset.target.from_group
        if source is None:
            return None
        cached = self.world.groups.get((namespace, source))
        if cached is None:
            raise ResetRefused(
                "SourceGroupNotFound",
                f"no ConsumerGroup {source} (spec.to.fromGroup) in namespace {namespace}",
            )
        try:
            name = parse_group(source, cached.body.get("spec")).group_name
        except SpecError as e:
            raise ResetRefused("SourceGroupNotFound", f"ConsumerGroup {source} cannot be read: {e}") from None
        keys = list(queues.refs) if keys is None else list(keys)
        found = await self._each(queues, keys, lambda admin, ref, _: admin.committed_offset(name, ref))
        return dict(zip(keys, found, strict=True))

    async def _commit(self, group: str, queues: Queues, rows: Sequence[Mapping[str, Any]]) -> None:
        targets = {row_key(r): int(r["target"]) for r in rows}

        await self._each(
            queues, list(targets), lambda admin, ref, key: admin.commit_offset(group, ref, targets[key])
        )

    async def _write(self, body: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        try:
            await self.writer.patch_status(
                key[0], OFFSET_RESETS, key[1], merge_patch(body.get("status") or {}, new)
            )
        except ApiError as e:
            self.metrics.reconcile_errors.labels("api").inc()
            delay = self.world.queue.add_rate_limited(("reset", *key))
            logger.warning("status of OffsetReset %s/%s not written: %s; retrying in %g s", *key, e, delay)
            return
        self._written[key] = (str(meta.get("uid")), new)
        if new.get("phase") != old.get("phase"):
            logger.info("OffsetReset %s/%s (group %s): %s", *key, reset_group(body), new.get("phase"))
            if new.get("phase") == FAILED:
                failure = condition(new, "Succeeded") or {}
                self._event(body, "Warning", str(failure.get("reason")), str(failure.get("message")))
            self.world.queue.add(("reset", *key))  # on to the next phase at once

    def _event(self, body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        self.writer.post_event({**body, "kind": OFFSET_RESET_KIND}, kind, reason, message)


def _summary(rows: Sequence[Mapping[str, Any]], verb: str) -> str:
    figures = totals(rows)
    return (
        f"{figures['queues']} queues {verb} reset: {figures['skipped']} messages skipped, "
        f"{figures['replayed']} consumed again"
    )
