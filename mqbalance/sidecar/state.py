"""What the sidecar serves: the groups' assignments, the topic routes, the producer state.

Sources (API watches, mounted files, tests) write here; HTTP handlers read. The answers are
encoded on arrival (``answers.py``); how long this pod may serve them is its grant
(``grant.py``): past it a group is fenced and serves no queues. Once the pod's application went
away (``presence.py``) a group with handover Release serves it none of the generation then served, and
tells the operator (an ``absent`` acknowledgement), which gives its queues on at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from mqbalance.contract import MAX_MEMBER_CLIENTS, Ack, AssignmentDocument, HandoverMode, LeaseTerms
from mqbalance.model import MessageQueue, TopicRoute
from mqbalance.producer import QueueSelector
from mqbalance.sidecar.answers import RouteEntry, Served, absent_view, dumps, fenced_view, member_view
from mqbalance.sidecar.grant import Grant, Monotonic
from mqbalance.sidecar.metrics import SidecarMetrics
from mqbalance.sidecar.moves import MoveTrace
from mqbalance.sidecar.presence import Presence

log = logging.getLogger(__name__)

WallClock = Callable[[], float]


class GroupState:
    """One ConsumerGroup's served assignment and the long-polls waiting on it."""

    def __init__(
        self,
        resource: str,
        member: str,
        metrics: SidecarMetrics,
        clock: WallClock,
        grant: Grant | None = None,
        presence: Presence | None = None,
        tell: Callable[[str, Ack], None] | None = None,
    ) -> None:
        self.resource = resource
        self.grant = grant if grant is not None else Grant()
        self._fenced = False
        """Fenced as last checked by :meth:`check_fence`."""
        self.member = member
        self.served: Served | None = None
        self._metrics = metrics
        self._clock = clock
        self._changed = asyncio.Event()
        self.waiting = 0
        """Long-polls waiting now."""
        self.acked: Ack | None = None
        """The last release acknowledgement this pod's application gave for the group."""
        self._stopping = False
        self._presence = presence
        self._tell = tell
        """Queues an acknowledgement for the operator (None: nobody records them; no absence then)."""
        self.absent_through: int | None = None
        """Since the pod's application went away: the latest generation that gave it something;
        none of its queues are served up to that generation, even after the application is back."""
        self._absence_told = False
        """An absent acknowledgement was queued: the operator must hear of the return too."""
        self.moves = MoveTrace(
            resource,
            lambda step, seconds: metrics.move_steps.labels(resource, step).observe(seconds),
            log.info,
            self.grant.monotonic,
        )

    def publish(self, doc: AssignmentDocument) -> bool:
        """Serve ``doc``; False when it is what is already served (a relist replays it)."""
        current = self.served
        if (
            current is not None
            and current.generation == doc.generation
            and doc.same_assignment(current.document)
        ):
            return False
        now = self._clock()
        view = member_view(self.resource, self.member, doc, now)
        self.served = Served(
            document=doc,
            received_at=now,
            queues_body=dumps(view),
            assignment_body=doc.encode().encode(),
            fenced_body=dumps(fenced_view(view)) if doc.lease is not None else b"",
            absent_body=dumps(absent_view(view)) if doc.handover is HandoverMode.RELEASE else b"",
        )
        self._after_absence(doc.generation)
        self._record(current.document if current is not None else None, doc, now)
        self.grant.changed.set()
        self._fenced = self.fenced()
        self._metrics.fenced.labels(self.resource).set(1 if self._fenced else 0)
        self._wake()
        log.info(
            "group %s: serving generation %d (%s), %d queues for %s",
            self.resource,
            doc.generation,
            doc.reason or "no reason given",
            sum(len(q) for q in doc.queues_of(self.member).values()),
            self.member,
        )
        return True

    def remaining(self) -> float | None:
        """Seconds the served assignment's grant still lasts (0: fenced); None without a grant."""
        served = self.served
        return None if served is None else self.grant.remaining(served.document.lease)

    def fenced(self) -> bool:
        """Serving no queues: the grant expired without a renewal that reached the API server."""
        return self.remaining() == 0.0

    def queues_body(self, served: Served) -> bytes:
        """``GET /v1/queues`` now: the encoded view with the grant's state spliced in."""
        if self.withholds(served.generation):
            return served.absent_body
        remaining = self.grant.remaining(served.document.lease)
        if remaining is not None and remaining <= 0.0:
            return served.fenced_body
        self.moves.read(served.generation)
        if remaining is None:
            return served.queues_body
        valid_ms = int(remaining * 1000)
        return served.queues_body[:-1] + b',"fenced":false,"grant":{"validForMs":%d}}' % valid_ms

    # -- the application gone (presence.py) ---------------------------------------------------

    def withholds(self, generation: int) -> bool:
        """Whether ``generation``'s queues are kept from this pod: its application went away while
        it was served (or an earlier one)."""
        return self.absent_through is not None and generation <= self.absent_through

    def _gives_member(self, doc: AssignmentDocument) -> bool:
        return self.member in doc.members or bool(doc.releasing_of(self.member))

    def went_away(self) -> None:
        """The pod's application is gone: serve it nothing of the generation served now, and tell the
        operator (all released, absent), again with each new generation while it stays away, so that
        the operator keeps it out. Handover Release only: without a handover there is nobody to tell,
        and an orderly consumer that merely lost its connection may still be processing a batch under
        the broker's lock, so its queues wait for the lock, as with RocketMQ's own rebalance. A pod
        the generation gives nothing, and that was not told gone yet, is no member to take out."""
        served = self.served
        if self._tell is None or served is None or served.document.handover is not HandoverMode.RELEASE:
            return
        gives = self._gives_member(served.document)
        if not gives and not self._absence_told:
            return
        if gives:
            log.warning(
                "group %s: the application's connections closed (it exited or crashed): serving it nothing "
                "of generation %d, its queues go on to others",
                self.resource,
                served.generation,
            )
            self.absent_through = served.generation
        self._absence_told = True
        self._tell(self.resource, Ack(served.generation, all=True, absent=True))
        self._wake()

    def came_back(self) -> None:
        """An application of the pod connected again. A generation that still gives the pod queues
        stays withheld (the operator may be giving them on): the next one, computed with the absence
        known, is served; one that gives it nothing is served at once."""
        served = self.served
        if not self._absence_told or served is None or self.withholds(served.generation):
            return
        self._returned(served.generation)

    def _after_absence(self, generation: int) -> None:
        """A new generation is served: still withheld while the application is away, else served."""
        if self._presence is not None and self._presence.absent:
            self.went_away()
        elif self._absence_told and not self.withholds(generation):
            self._returned(generation)

    def _returned(self, generation: int) -> None:
        log.info("group %s: the application is back: serving generation %d", self.resource, generation)
        self.absent_through = None
        # Replaces the absent acknowledgement: the operator counts the pod in again.
        if self._tell is not None:
            self._tell(self.resource, Ack(generation))
        self._absence_told = False
        self._wake()

    def ack_for(self, generation: int, everything: bool) -> Ack:
        """What a release of ``generation`` records: while that generation is withheld, the absent
        acknowledgement again (the pod holds nothing of it), so that a returning application's
        release does not hide its absence from the operator before the next generation."""
        if self.absent_through is not None and self.withholds(generation):
            return Ack(self.absent_through, all=True, absent=True)
        if self._absence_told and self._presence is not None and self._presence.absent:
            # Connected again but not back yet (RETURN_CONFIRM_SECONDS): still absent for the operator.
            return Ack(generation, all=True, absent=True)
        return Ack(generation, everything)

    def check_fence(self) -> bool:
        """Note a change of the fence (metric, log, long-polls woken); whether it changed."""
        fenced = self.fenced()
        if fenced == self._fenced:
            return False
        self._fenced = fenced
        self._metrics.fenced.labels(self.resource).set(1 if fenced else 0)
        if fenced:
            log.error(
                "group %s: no Lease renewal reached the API server for %gs: fenced, serving no queues",
                self.resource,
                self.served.document.lease.seconds if self.served and self.served.document.lease else 0,
            )
        else:
            log.warning("group %s: Lease renewed: serving generation %s", self.resource, self._generation())
        self._wake()
        return True

    def _generation(self) -> int | None:
        return self.served.generation if self.served is not None else None

    def withdraw(self) -> None:
        """The ConfigMap is gone: serve nothing rather than a stale assignment."""
        if self.served is not None:
            log.warning("group %s: assignment withdrawn (ConfigMap deleted)", self.resource)
            self.served = None
            self.absent_through, self._absence_told = None, False  # a group made again counts anew
            self._metrics.owned_queues.labels(self.resource).set(0)
            self._wake()

    def stop_waiting(self) -> None:
        """The sidecar stops: long-polls answer now, and from now on at once, with what is served."""
        self._stopping = True
        self.moves.flush()
        self._wake()

    async def wait_change(self, after: int, timeout: float) -> Served | None:
        """The served assignment once its generation differs from ``after``, or at ``timeout``
        (or at once while the sidecar stops)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        fenced = self._fenced
        withheld = self.absent_through
        while True:
            served = self.served
            if (served is not None and served.generation != after) or self._stopping:
                return served
            if self._fenced != fenced or self.absent_through != withheld:
                return served  # fenced or withheld, or serving again: the view changed
            remaining = deadline - loop.time()
            if remaining <= 0:
                return served
            self.waiting += 1
            self._metrics.long_polls.labels(self.resource).inc()
            try:
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
            except TimeoutError:
                return self.served
            finally:
                self.waiting -= 1
                self._metrics.long_polls.labels(self.resource).dec()

    def drained(self) -> bool:
        """Nothing left to hand over: no handover, or this pod holds nothing and releases nothing."""
        served = self.served
        if served is None or served.document.handover is HandoverMode.OFF:
            return True
        doc = served.document
        holds = any(doc.queues_of(self.member).values())
        return not holds and self.member not in doc.members and not doc.releasing_of(self.member)

    async def wait_drained(self, timeout: float) -> bool:
        """Whether the pod drained within ``timeout`` seconds (see :meth:`drained`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.drained():
            remaining = deadline - loop.time()
            if remaining <= 0 or self._stopping:
                return False
            served = self.served
            await self.wait_change(served.generation if served else -1, remaining)
        return True

    def wake(self) -> None:
        """Let long-polls and drains look again (a release was recorded)."""
        self._wake()

    def _wake(self) -> None:
        # Waiters hold the old event; a fresh one serves the next change.
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def _record(self, previous: AssignmentDocument | None, doc: AssignmentDocument, now: float) -> None:
        m, g = self._metrics, self.resource
        new = _owned(doc, self.member)
        old = _owned(previous, self.member) if previous is not None else set()
        m.assignment_generation.labels(g).set(doc.generation)
        m.owned_queues.labels(g).set(len(new))
        m.rebalances.labels(g).inc()
        m.queues_added.labels(g).inc(len(new - old))
        m.queues_revoked.labels(g).inc(len(old - new))
        # The first document after start may have been computed long ago; only a
        # replacement measures how fast a rebalance reached this pod.
        if previous is not None:
            propagation = max(0.0, now - doc.computed_at) if doc.computed_at > 0 else None
            if propagation is not None:
                m.propagation_delay.labels(g).observe(propagation)
            self.moves.began(doc.generation, len(new - old), len(old - new), propagation)


def _owned(doc: AssignmentDocument, member: str) -> set[MessageQueue]:
    return {mq for queues in doc.queues_of(member).values() for mq in queues}


RETURN_CONFIRM_SECONDS = 1.0
"""How long a connection that named a client while the pod was absent must stay open before the
application counts as back: a killed process's last request can be read after its other connections
closed, and counting it in would take the pod out and in again (Flapping)."""


class SidecarState:
    """Everything the API serves, for one pod."""

    def __init__(
        self,
        member: str,
        groups: Iterable[str],
        selector: QueueSelector,
        metrics: SidecarMetrics | None = None,
        *,
        clock: WallClock = time.time,
        monotonic: Monotonic = time.monotonic,
    ) -> None:
        self.member = member
        self.metrics = metrics if metrics is not None else SidecarMetrics()
        self.selector = selector
        self.grant = Grant(monotonic)
        self.presence = Presence()
        self.told: dict[str, Ack] = {}
        """Acknowledgements the sidecar itself owes the operator (an absence, a return), by group."""
        self.told_changed = asyncio.Event()
        self.groups = {
            g: GroupState(g, member, self.metrics, clock, self.grant, self.presence, self._tell)
            for g in groups
        }
        if not self.groups:
            raise ValueError("a sidecar serves at least one group")
        self.default_group = next(iter(self.groups))
        self._topics: dict[str, RouteEntry] = {}
        """Topic resource name -> route."""
        self._by_topic: dict[str, RouteEntry] = {}
        """RocketMQ topic name -> route."""
        self._route_brokers: frozenset[str] = frozenset()
        """Every broker a route names: the only ones a send report may name."""
        self.metrics.watch_brokers(self.broker_states)
        self.clients: dict[str, None] = {}
        """The RocketMQ client ids this pod's applications named (``?client=``), oldest first: the
        member Lease carries them, so the operator can release the broker locks of a fenced pod."""

    def saw_client(self, client_id: str) -> None:
        """An application named its RocketMQ client id; the newest ``MAX_MEMBER_CLIENTS`` are kept."""
        if client_id in self.clients:
            return
        self.clients[client_id] = None
        while len(self.clients) > MAX_MEMBER_CLIENTS:
            del self.clients[next(iter(self.clients))]

    def _tell(self, group: str, ack: Ack) -> None:
        self.told[group] = ack  # only the newest matters
        self.told_changed.set()

    def client_connected(self, client_id: str, connection: object) -> None:
        """A request naming ``client_id`` came on ``connection`` (kept until :meth:`client_closed`)."""
        absent = self.presence.connected(client_id, connection)
        self.metrics.connected_clients.set(self.presence.clients())
        if absent:
            asyncio.get_running_loop().call_later(RETURN_CONFIRM_SECONDS, self._confirm_return)

    def _confirm_return(self) -> None:
        if self.presence.confirm():
            for group in self.groups.values():
                group.came_back()

    def client_closed(self, client_id: str, connection: object, by_peer: bool) -> None:
        gone = self.presence.closed(client_id, connection, by_peer)
        self.metrics.connected_clients.set(self.presence.clients())
        if gone:
            self.metrics.application_gone.inc()
            for group in self.groups.values():
                group.went_away()

    # -- assignments -------------------------------------------------------------

    def group_named(self, name: str) -> GroupState | None:
        """The group served under ConsumerGroup resource ``name``, else the one whose published
        document names RocketMQ group ``name`` (``spec.groupName``, which RocketMQ's clients know
        and Kubernetes names cannot always spell: ``GID_ORDERS``); None when neither or several."""
        group = self.groups.get(name)
        if group is not None:
            return group
        named = [g for g in self.groups.values() if g.served is not None and g.served.document.group == name]
        return named[0] if len(named) == 1 else None

    def publish(self, group: str, doc: AssignmentDocument) -> bool:
        return self.groups[group].publish(doc)

    def withdraw(self, group: str) -> None:
        self.groups[group].withdraw()

    def lease_terms(self) -> LeaseTerms | None:
        """The strictest lease terms of the served documents (shortest lease, most frequent renewal)."""
        docs = [g.served.document for g in self.groups.values() if g.served is not None]
        terms = [d.lease for d in docs if d.lease is not None]
        if not terms:
            return None
        return LeaseTerms(min(t.seconds for t in terms), min(t.renew_seconds for t in terms))

    def confirm_contact(self, sent_at: float) -> None:
        """A Lease renewal sent at ``sent_at`` (monotonic) succeeded."""
        self.grant.confirm(sent_at)
        self.check_fences()

    def check_fences(self) -> None:
        for group in self.groups.values():
            group.check_fence()

    async def watch_fences(self) -> None:
        """Fence each group the moment its grant expires (metric, long-polls), until cancelled."""
        grant = self.grant
        while True:
            grant.changed.clear()
            self.check_fences()
            left = [r for g in self.groups.values() if (r := g.remaining())]
            # A hair past the expiry, so the check after the wait sees it expired. asyncio.timeout,
            # not wait_for: on Python 3.11 wait_for drops a cancellation that meets the wake-up, and
            # this loop would then outlive the sidecar's shutdown.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left) + 0.001 if left else None):
                    await grant.changed.wait()

    def missing_groups(self) -> list[str]:
        return [g for g, s in self.groups.items() if s.served is None]

    def stop_waiting(self) -> None:
        """Answer every long-poll now: the sidecar stops (see :meth:`GroupState.stop_waiting`)."""
        for group in self.groups.values():
            group.stop_waiting()

    # -- topic routes ------------------------------------------------------------

    def put_route(self, resource: str, route: TopicRoute) -> None:
        self._topics[resource] = RouteEntry.of(resource, route)
        self._reindex()

    def delete_route(self, resource: str) -> None:
        self._topics.pop(resource, None)
        self._reindex()

    def _reindex(self) -> None:
        self._by_topic = {e.route.topic: e for _, e in sorted(self._topics.items())}
        self._route_brokers = frozenset(b.name for e in self._topics.values() for b in e.route.brokers)

    def route_entry(self, topic: str) -> RouteEntry | None:
        """By RocketMQ topic name, else by Topic resource name."""
        found = self._by_topic.get(topic)
        return found if found is not None else self._topics.get(topic)

    def route(self, topic: str) -> tuple[str, TopicRoute] | None:
        """(resource name, route), by RocketMQ topic name, else by Topic resource name."""
        entry = self.route_entry(topic)
        return None if entry is None else (entry.resource, entry.route)

    def topic_names(self) -> list[str]:
        return sorted(self._by_topic)

    # -- producer faults ---------------------------------------------------------

    def routes_broker(self, name: str) -> bool:
        return name in self._route_brokers

    def route_brokers(self) -> list[str]:
        return sorted(self._route_brokers)

    def brokers(self) -> list[str]:
        """Every broker a route names or a send report mentioned (a broker since gone from the routes)."""
        return sorted(self._route_brokers.union(i.broker for i in self.selector.faults.items()))

    def broker_states(self) -> list[tuple[str, bool]]:
        faults = self.selector.faults
        return [(b, faults.is_available(b)) for b in self.brokers()]

    def faults_json(self) -> dict[str, Any]:
        faults = self.selector.faults
        brokers = []
        for name in self.brokers():
            item = faults.item(name)
            if item is None:
                brokers.append(
                    {
                        "broker": name,
                        "currentLatencyMs": 0,
                        "isolatedUntilMs": None,
                        "isolatedForMs": 0,
                        "available": True,
                        "reachable": True,
                        "reported": False,
                    }
                )
            else:
                brokers.append({**item.to_json(), "reported": True})
        return {
            "generation": self.selector.generation.value,
            "faultTolerance": self.selector.fault_tolerance,
            "table": faults.table.to_json(),
            "brokers": brokers,
        }
