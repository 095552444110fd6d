"""What the reliability tests share: the rig, a killable operator, a generation watcher, churn."""

from __future__ import annotations

import itertools
import random
import re
import threading
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from harness.apps.operator import OperatorProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from mqbalance.contract import CONFIGMAP_KEY, Ack, AssignmentDocument, DocumentError, Release, decode_acks
from mqbalance.journal import JournalRecord
from mqbalance.model import MessageQueue
from tests.integration.invariants import assignment_problems
from tests.integration.operator_support import apply_group, condition, read_document, status_of

PUBLISHED_BY = "mqbalance.io/published-by"


@dataclass(frozen=True)
class Rig:
    """What a reliability test works with (the ``rig`` fixture): the API and the test's namespace,
    a node per zone, the two Topics' readable queues, the watcher checking every generation
    published there, and the starter of operator processes."""

    api: client.ApiClient
    namespace: str
    nodes: list[str]
    topics: dict[str, list[MessageQueue]]
    watcher: GenerationWatcher
    start_operator: Callable[..., OperatorProcess]


# -- watching every published generation -----------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """One generation of a group: as the watch saw it, or (a generation published while the watch
    was away) as the operator's journal recorded it."""

    group: str
    generation: int
    topics: Mapping[str, Mapping[str, Sequence[MessageQueue]]]
    """Topic -> member -> queues."""
    members: tuple[str, ...]
    releasing: tuple[Release, ...]
    source: str
    """``watch`` or ``journal``."""
    resource_version: str = ""
    published_by: str | None = None
    acks: Mapping[str, Ack] | None = None
    """The group's release acknowledgements as the watch had delivered them when this generation
    came (one watch delivers every ConfigMap of the namespace in the order they were written);
    None: not known (read from the journal, or at a relist)."""


@dataclass(frozen=True)
class WatchFigures:
    """How much a :class:`GenerationWatcher` checked, and how its watch fared."""

    documents_read: int
    """Distinct ConfigMap versions decoded and checked (foreign rewrites of a generation included)."""
    generations_seen: int
    """Generations the watch delivered."""
    generations_from_journal: int
    """Generations published while the watch was away, read and checked from the journal."""
    pairs_compared: int
    """Consecutive generations of a group compared (order, and no generation missing between them)."""
    outages: int
    """Times the watch broke (connection refused or reset, an API error) and later worked again."""
    failed_requests: int
    relists: int
    """Lists after the first (a 410 Gone): what was published since the watch broke may be missing."""
    gaps: int
    """Generations missing at a relist: published while the watch was away."""

    @property
    def generations_checked(self) -> int:
        return self.generations_seen + self.generations_from_journal

    def line(self) -> str:
        names = (f.name for f in fields(self))
        return " ".join(f"{name}={getattr(self, name)}" for name in names)


@dataclass
class GenerationWatcher:
    """Records every ConfigMap generation published in a namespace and checks each one.

    A background thread lists and then watches the namespace's assignment ConfigMaps, resuming
    the watch from the last resourceVersion after a network or API error (the API server may be
    restarted under it) and listing again after 410 Gone. Every new resourceVersion is decoded
    and checked against the clustering invariants with the readable queues the test declared.
    Per group the generations must only increase, one at a time: a generation missing in an
    unbroken watch is a problem; one missing at a relist (published while the watch was away) is
    a gap, closed by :meth:`assert_clean` from the operator's journal (checked the same way) or
    reported. Anything else the thread meets is a problem too.
    """

    api: client.ApiClient | None
    namespace: str
    readable: Mapping[str, Sequence[MessageQueue]] = field(default_factory=dict)
    """Topic name (RocketMQ) -> readable queues; documents are checked against these."""
    problems: list[str] = field(default_factory=list)
    documents_read: int = 0
    outages: int = 0
    failed_requests: int = 0
    relists: int = 0
    _history: dict[str, list[Published]] = field(default_factory=dict)
    """Group -> every distinct generation the watch delivered, in the order it came."""
    _gaps: list[tuple[str, int, int]] = field(default_factory=list)
    """(group, first, last) generations published while the watch was away."""
    _initial: set[str] = field(default_factory=set)
    """Groups already published when the watcher first listed: their history before is not ours."""
    _acks: dict[str, dict[str, Ack]] = field(default_factory=dict)
    """Group -> its releases ConfigMap's acknowledgements as last delivered."""
    _lists: int = 0
    _down: bool = False
    _versions: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def start(self) -> GenerationWatcher:
        self._thread = threading.Thread(target=self._run, name="generation-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def generations(self, group: str) -> list[int]:
        with self._lock:
            return [p.generation for p in self._history.get(group, [])]

    def total(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._history.values())

    def history(self, group: str) -> list[Published]:
        """The group's generations the watch delivered, in order (with :meth:`assert_clean`'s
        journal, the gaps closed too, in generation order)."""
        with self._lock:
            return list(self._history.get(group, []))

    def latest(self, group: str) -> Published | None:
        with self._lock:
            items = self._history.get(group)
            return items[-1] if items else None

    def wait_seen(self, group: str, generation: int, timeout: float = 30.0) -> None:
        """Until the watch has delivered ``generation`` of ``group`` (or a later one)."""

        def seen() -> bool:
            latest = self.latest(group)
            return latest is not None and latest.generation >= generation

        wait_for(f"the watcher to see generation {generation} of {group}", seen, timeout)

    def figures(self) -> WatchFigures:
        with self._lock:
            watched = [p for items in self._history.values() for p in items if p.source == "watch"]
            return WatchFigures(
                documents_read=self.documents_read,
                generations_seen=len(watched),
                generations_from_journal=self.total() - len(watched),
                pairs_compared=sum(max(len(items) - 1, 0) for items in self._history.values()),
                outages=self.outages,
                failed_requests=self.failed_requests,
                relists=max(self._lists - 1, 0),
                gaps=sum(last - first + 1 for _, first, last in self._gaps),
            )

    def assert_clean(
        self,
        *,
        min_generations: int,
        max_outages: int = 0,
        journal: Iterable[JournalRecord] | None = None,
    ) -> WatchFigures:
        """No invariant broken; per group every generation one more than the one before (the
        gaps of the watch closed from ``journal``, the operator's journal); at least
        ``min_generations`` checked; at most ``max_outages`` breaks of the watch (what the test
        injected). Returns what was checked."""
        with self._lock:
            self._close_gaps(list(journal) if journal is not None else None)
            problems = list(self.problems)
            for group, items in self._history.items():
                gens = [p.generation for p in items if p.source == "watch"]
                if any(after <= before for before, after in itertools.pairwise(gens)):
                    problems.append(f"{group}: a generation went back or repeated: {gens}")
                    continue
                items.sort(key=lambda p: p.generation)  # the gaps closed from the journal in their places
                merged = [p.generation for p in items]
                holes = [(a, b) for a, b in itertools.pairwise(merged) if b != a + 1]
                if holes:
                    problems.append(f"{group}: generations missing between {holes}: checked {merged}")
            figures = self.figures()
        assert not problems, "\n".join(problems)
        assert figures.generations_checked >= min_generations, (
            f"the watcher checked {figures.generations_checked} generations, fewer than the "
            f"{min_generations} the test caused: {figures.line()}"
        )
        assert figures.outages <= max_outages, (
            f"the watch broke {figures.outages} times, more than the {max_outages} the test's faults "
            f"explain: {figures.line()}"
        )
        return figures

    # -- what the watch delivers -----------------------------------------------------------

    def listed(self, items: Iterable[tuple[str, str, str | None, Mapping[str, str] | None]]) -> None:
        """A complete listing: (name, resourceVersion, document text, annotations) of each ConfigMap."""
        with self._lock:
            first = self._lists == 0
            self._lists += 1
            for name, version, text, annotations in items:
                if first and name.endswith("-assignment"):
                    self._initial.add(name.removesuffix("-assignment"))
                self.record(name, version, text, annotations, relisted=not first)

    def record_releases(self, name: str | None, data: Mapping[str, str] | None) -> None:
        """A version of a group's releases ConfigMap, in the watch's order."""
        if name and name.endswith("-releases"):
            with self._lock:
                self._acks[name.removesuffix("-releases")] = decode_acks(data)

    def record(
        self,
        name: str,
        version: str,
        text: str | None,
        annotations: Mapping[str, str] | None = None,
        *,
        relisted: bool = False,
    ) -> None:
        """One version of a ConfigMap; ``relisted``: from a listing after the watch broke."""
        if not name.endswith("-assignment") or version in self._versions or text is None:
            return
        group = name.removesuffix("-assignment")
        with self._lock:
            self._versions.add(version)
            self.documents_read += 1
            try:
                doc = AssignmentDocument.decode(text)
            except DocumentError as e:
                self.problems.append(f"{name}@{version}: undecodable: {e}")
                return
            self._check(doc.group, doc.generation, doc.strategy, doc.message_model, doc.members,
                        doc.topics, doc.releasing)  # fmt: skip
            items = self._history.setdefault(group, [])
            last = items[-1] if items else None
            if (
                last is not None
                and last.generation == doc.generation
                and last.topics == doc.topics
                and last.releasing == doc.releasing
            ):
                return  # the same document rewritten only for foreign metadata (a test's own writes)
            expected = last.generation + 1 if last is not None else None if group in self._initial else 1
            if expected is not None and doc.generation > expected:
                if relisted:
                    self._gaps.append((group, expected, doc.generation - 1))
                else:
                    self.problems.append(
                        f"{group}: generation {doc.generation} came after {expected - 1} in an unbroken "
                        "watch: the generations between were never published, or published twice"
                    )
            items.append(
                Published(
                    group,
                    doc.generation,
                    doc.topics,
                    tuple(sorted(doc.members)),
                    doc.releasing,
                    "watch",
                    version,
                    (annotations or {}).get(PUBLISHED_BY),
                    None if relisted else dict(self._acks.get(group, {})),
                )
            )

    def failed(self, error: BaseException) -> None:
        """A list or watch request failed (the API server away or failing)."""
        with self._lock:
            self.failed_requests += 1
            if not self._down:
                self.outages += 1
                self._down = True

    def worked(self) -> None:
        """A list or watch request worked: an outage, if any, is over."""
        with self._lock:
            self._down = False

    # -- checks ------------------------------------------------------------------------------

    def _check(
        self,
        group: str,
        generation: int,
        strategy: str,
        message_model: str,
        members: Mapping[str, str],
        topics: Mapping[str, Mapping[str, Sequence[MessageQueue]]],
        releasing: Sequence[Release],
    ) -> None:
        readable = {t: list(self.readable.get(t, ())) for t in topics}
        revoked = [mq for r in releasing for mq in r.queues]
        for problem in assignment_problems(strategy, message_model, members, topics, readable, revoked):
            self.problems.append(f"{group} generation {generation}: {problem}")

    def _close_gaps(self, journal: list[JournalRecord] | None) -> None:
        """Fill the watch's gaps from the journal, checking each generation read there."""
        for group, first, last in self._gaps:
            items = self._history.setdefault(group, [])
            have = {p.generation for p in items}
            for generation in range(first, last + 1):
                if generation in have:
                    continue
                found = [
                    r
                    for r in journal or ()
                    if r.namespace == self.namespace and r.group == group and r.generation == generation
                ]
                if not found:
                    where = "no journal was given" if journal is None else "it is not in the journal"
                    self.problems.append(
                        f"{group}: generation {generation} was published while the watch was away and "
                        f"never checked: {where}"
                    )
                    continue
                for r in found:
                    self._check(group, generation, r.strategy.name.value, r.message_model, r.members,
                                r.assignment, r.releasing)  # fmt: skip
                r = found[-1]
                items.append(
                    Published(
                        group, generation, r.assignment, tuple(sorted(r.members)), r.releasing, "journal"
                    )
                )

    def _run(self) -> None:
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = core.list_namespaced_config_map(self.namespace, _request_timeout=10)
                    self.worked()
                    self.listed(_entry(cm.metadata, cm.data) for cm in listed.items)
                    for cm in listed.items:  # acknowledgements from before are known only as they are now
                        self.record_releases(cm.metadata.name if cm.metadata else None, cm.data)
                    assert listed.metadata is not None
                    version = listed.metadata.resource_version
                w = watch.Watch()
                for event in w.stream(
                    core.list_namespaced_config_map,
                    self.namespace,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=5,
                    _request_timeout=15,
                ):
                    self.worked()
                    if event["type"] == "BOOKMARK":
                        version = event["raw_object"]["metadata"]["resourceVersion"]
                        continue
                    version = event["object"].metadata.resource_version
                    if event["type"] != "DELETED":
                        self.record_releases(event["object"].metadata.name, event["object"].data)
                        self.record(*_entry(event["object"].metadata, event["object"].data))
                    if self._stop.is_set():
                        break
                else:
                    self.worked()  # the server ended the watch at its timeout
            except ApiException as e:
                if e.status == 410:
                    version = None  # too old: list again
                else:
                    self.failed(e)
                self._stop.wait(0.2)
            except (urllib3.exceptions.HTTPError, OSError) as e:  # refused or reset: the server restarts
                self.failed(e)
                self._stop.wait(0.2)
            except Exception:  # anything else is the watcher's own bug, or the API's: a problem
                with self._lock:
                    self.problems.append(f"the watch failed:\n{traceback.format_exc()}")
                self._stop.wait(0.2)


def _entry(
    meta: Any, data: Mapping[str, str] | None
) -> tuple[str, str, str | None, Mapping[str, str] | None]:
    """(name, resourceVersion, document text, annotations) of a ConfigMap."""
    return meta.name, meta.resource_version, (data or {}).get(CONFIGMAP_KEY), meta.annotations


# -- checks across generations, and of logs ---------------------------------------------------------


def handover_problems(history: Sequence[Published], departed: set[str]) -> tuple[list[str], int]:
    """Queues that went straight from one member to another across consecutive generations while
    the old owner was still running and had not let go of everything; and how many pairs of
    consecutive generations were compared. Two generations with one missing between them cannot
    be compared: that is a problem too (the watcher closes its gaps from the journal first)."""
    problems = []
    pairs = 0
    for before, after in itertools.pairwise(history):
        if after.generation != before.generation + 1:
            problems.append(f"generations {before.generation} and {after.generation} are not consecutive")
            continue
        pairs += 1
        held = {mq: m for a in before.topics.values() for m, qs in a.items() for mq in qs}
        for assignment in after.topics.values():
            for member, queues in assignment.items():
                for mq in queues:
                    old = held.get(mq)
                    if old is not None and old != member and old not in departed:
                        problems.append(
                            f"generation {after.generation}: {mq} went from {old} to {member} in one step"
                        )
    return problems, pairs


def release_problems(history: Sequence[Published], departed: set[str]) -> tuple[list[str], int]:
    """Revoked queues handed on before their owner released them: across consecutive generations, a
    queue the first still held back from its owner (``releasing``) and the second gives to another member,
    while that owner's acknowledgement as the watch had delivered it said it had not let go (it
    acknowledged the revoking generation, or said "all" having seen the one before: the contract's
    rule, docs/sidecar.md) and the owner was not gone (``departed``). Also how many handed-on
    queues were checked (a pair whose acknowledgements are not known is not checked)."""
    problems = []
    checked = 0
    for before, after in itertools.pairwise(history):
        if after.generation != before.generation + 1 or after.acks is None:
            continue
        given = {mq: member for a in after.topics.values() for member, qs in a.items() for mq in qs}
        for release in before.releasing:
            # A revocation taken back (the queue given to its owner again) hands nothing on.
            moved = [mq for mq in release.queues if given.get(mq, release.owner) != release.owner]
            if not moved or release.owner in departed:
                continue
            checked += len(moved)
            ack = after.acks.get(release.owner)
            if ack is None or not (
                ack.generation >= release.generation or (ack.all and ack.generation >= release.generation - 1)
            ):
                problems.append(
                    f"generation {after.generation}: {len(moved)} queues revoked from {release.owner} in "
                    f"generation {release.generation} handed on before it released them (its ack: "
                    f"{ack}): {moved[0]}"
                )
    return problems, checked


LOG_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)"
)
"""A line of the operator's and the sidecar's logs (``%(asctime)s %(levelname)s %(name)s: %(message)s``)."""


def unexpected_errors(log: str, expected: Mapping[tuple[str, str], str]) -> list[str]:
    """ERROR/CRITICAL lines whose message is not one of ``expected`` ((logger, a regular expression
    the whole message must match) -> why it is expected), and the first line of every traceback
    that does not belong to an expected ERROR line right above it."""
    bad = []
    explained = False  # the last log record was an expected ERROR: its traceback may follow
    for line in log.splitlines():
        record = LOG_LINE.fullmatch(line)
        if record is not None:
            explained = False
            if record["level"] in ("ERROR", "CRITICAL"):
                explained = any(
                    record["logger"] == logger and re.fullmatch(message, record["message"])
                    for logger, message in expected
                )
                if not explained:
                    bad.append(line)
        elif line.startswith("Traceback (most recent call last)") and not explained:
            bad.append(line)
        elif re.search(r"\b(ERROR|CRITICAL)\b", line) and not explained:
            bad.append(line)  # an error in another format (another logger's, or a bare print)
    return bad


# -- faults, counted where they land ----------------------------------------------------------------


def process_start(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot: field 22 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def restarted(cluster: LocalCluster, component: str, disrupt: Callable[[], None]) -> bool:
    """Run ``disrupt`` and tell whether ``component`` (``kube-apiserver``, ``etcd``) is now another
    process than before (another pid, or the same pid started later) and running."""
    pid = cluster.pids[component]
    before = (pid, process_start(pid))
    disrupt()
    pid = cluster.pids[component]
    return cluster.running and (pid, process_start(pid)) != before


# -- a namespace's consumer pods, churned ------------------------------------------------------------


@dataclass
class Churn:
    """Random membership changes over a set of groups, each group's pods labelled ``app=<group>``."""

    api: client.ApiClient
    namespace: str
    groups: Sequence[str]
    nodes: Sequence[str]
    rng: random.Random
    max_pods: int = 5
    pods: dict[str, dict[str, bool]] = field(default_factory=dict)
    """group -> pod name -> ready."""
    actions: int = 0

    def __post_init__(self) -> None:
        for g in self.groups:
            self.pods.setdefault(g, {})

    def add(self, group: str, ready: bool = True) -> str:
        name = f"{group}-{uuid.uuid4().hex[:5]}"
        kubelet.create_pod(self.api, self.namespace, name, {"app": group})
        kubelet.bind_pod(self.api, self.namespace, name, self.rng.choice(list(self.nodes)))
        kubelet.set_pod_ready(self.api, self.namespace, name, ready)
        self.pods[group][name] = ready
        return name

    def step(self) -> str:
        """One random change: a pod joins, leaves, turns unready or ready again."""
        group = self.rng.choice(list(self.groups))
        pods = self.pods[group]
        choices = ["add"] if len(pods) < 2 else ["add", "delete", "flip", "flip"]
        if len(pods) >= self.max_pods:
            choices.remove("add")
        action = self.rng.choice(choices)
        self.actions += 1
        if action == "add":
            return f"add {self.add(group)}"
        name = self.rng.choice(sorted(pods))
        if action == "delete":
            kubelet.delete_pod(self.api, self.namespace, name, wait=False)
            del pods[name]
            return f"delete {name}"
        pods[name] = not pods[name]
        kubelet.set_pod_ready(self.api, self.namespace, name, pods[name])
        return f"{'ready' if pods[name] else 'unready'} {name}"

    def members(self, group: str) -> set[str]:
        return {name for name, ready in self.pods[group].items() if ready}


def start_churn(
    api: client.ApiClient,
    namespace: str,
    nodes: Sequence[str],
    rng: random.Random,
    specs: Mapping[str, Mapping[str, Any]],
    pods: int = 1,
) -> Churn:
    """The groups of ``specs``, each selecting the pods labelled ``app=<group>``, and ``pods``
    Ready pods of each."""
    for group, spec in specs.items():
        apply_group(api, namespace, group, {**spec, "selector": {"matchLabels": {"app": group}}})
    churn = Churn(api, namespace, list(specs), nodes, rng)
    for group in specs:
        for _ in range(pods):
            churn.add(group)
    return churn


def converged(
    api: client.ApiClient, namespace: str, group: str, members: Iterable[str]
) -> AssignmentDocument | None:
    """The group's document once it names exactly ``members`` and the status reports that generation."""
    doc = read_document(api, namespace, group)
    if doc is None or set(doc.members) != set(members):
        return None
    status = status_of(api, namespace, group)
    if status.get("assignmentGeneration") != doc.generation:
        return None
    if condition(status, "Invalid").get("status") == "True":
        return None
    return doc


def wait_converged(
    api: client.ApiClient,
    namespace: str,
    group: str,
    members: Iterable[str],
    timeout: float = 60.0,
    caused: Caused | None = None,
) -> AssignmentDocument:
    want = set(members)
    doc = wait_for(
        f"{namespace}/{group} to publish members {sorted(want)}",
        lambda: converged(api, namespace, group, want),
        timeout,
    )
    if caused is not None:
        caused.converged(doc)
    return doc


@dataclass
class Caused:
    """A lower bound of the generations a test caused, from what it waited for: a group's first
    document is one generation, and each later convergence on other members at least one more."""

    generations: int = 0
    latest: dict[str, int] = field(default_factory=dict)
    """Group -> the last generation converged on."""
    _members: dict[str, frozenset[str]] = field(default_factory=dict)

    def converged(self, doc: AssignmentDocument) -> None:
        members = frozenset(doc.members)
        if self._members.get(doc.group) != members:
            self.generations += 1
        self._members[doc.group] = members
        self.latest[doc.group] = max(doc.generation, self.latest.get(doc.group, 0))

    def check(
        self, watcher: GenerationWatcher, journal: Iterable[JournalRecord], max_outages: int = 0
    ) -> WatchFigures:
        """Once the watcher has seen every generation converged on: it is clean and checked at
        least the generations caused."""
        for group, generation in self.latest.items():
            watcher.wait_seen(group, generation)
        return watcher.assert_clean(
            min_generations=self.generations, max_outages=max_outages, journal=journal
        )


def owner_count(doc: AssignmentDocument) -> dict[MessageQueue, int]:
    counts: dict[MessageQueue, int] = {}
    for assignment in doc.topics.values():
        for queues in assignment.values():
            for mq in queues:
                counts[mq] = counts.get(mq, 0) + 1
    return counts
