"""Helpers of the reliability tests: a killable operator, a generation watcher, membership churn."""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from harness import kubelet
from harness.polling import wait_for
from mqbalance.contract import CONFIGMAP_KEY, AssignmentDocument, DocumentError
from mqbalance.model import MessageQueue
from tests.integration.invariants import assignment_problems
from tests.integration.operator_support import condition, read_document, status_of

PUBLISHED_BY = "mqbalance.io/published-by"


# -- watching every published generation -----------------------------------------------------------


@dataclass
class Seen:
    group: str
    generation: int
    resource_version: str
    published_by: str | None
    members: tuple[str, ...]


@dataclass
class GenerationWatcher:
    """Records every ConfigMap generation published in a namespace and checks each one.

    A background thread lists and then watches the namespace's assignment ConfigMaps,
    reconnecting after any error (the API server may be restarted under it) and listing
    again after 410 Gone. For every new resourceVersion it decodes the document, checks
    the clustering invariants against the readable queues the test declared, and
    remembers the generation, so a test can assert that generations only ever increase.
    """

    api: client.ApiClient
    namespace: str
    readable: Mapping[str, Sequence[MessageQueue]] = field(default_factory=dict)
    """Topic name (RocketMQ) -> readable queues; documents are checked against these."""
    seen: dict[str, list[Seen]] = field(default_factory=dict)
    documents: dict[str, list[AssignmentDocument]] = field(default_factory=dict)
    """Group -> every distinct document seen, in order (for checks across generations)."""
    problems: list[str] = field(default_factory=list)
    reconnects: int = 0
    _versions: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

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
            return [s.generation for s in self.seen.get(group, [])]

    def total(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.seen.values())

    def docs(self, group: str) -> list[AssignmentDocument]:
        with self._lock:
            return list(self.documents.get(group, []))

    def latest(self, group: str) -> Seen | None:
        with self._lock:
            items = self.seen.get(group)
            return items[-1] if items else None

    def assert_clean(self) -> None:
        """No invariant broken, and per group every generation seen is greater than the one before."""
        with self._lock:
            problems = list(self.problems)
            for group, items in self.seen.items():
                gens = [s.generation for s in items]
                for before, after in itertools.pairwise(gens):
                    if after <= before:
                        problems.append(f"{group}: generation {after} published after {before}: {gens}")
                        break
        assert not problems, "\n".join(problems)

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = core.list_namespaced_config_map(self.namespace, _request_timeout=10)
                    for cm in listed.items:
                        self._record(cm.metadata, cm.data)
                    assert listed.metadata is not None
                    version = listed.metadata.resource_version
                w = watch.Watch()
                for event in w.stream(
                    core.list_namespaced_config_map,
                    self.namespace,
                    resource_version=version,
                    timeout_seconds=5,
                    _request_timeout=15,
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = None  # 410 Gone: list again
                        break
                    version = obj.metadata.resource_version
                    if event["type"] != "DELETED":
                        self._record(obj.metadata, obj.data)
                    if self._stop.is_set():
                        break
            except ApiException as e:
                if e.status == 410:
                    version = None
                self.reconnects += 1
                time.sleep(0.2)
            except Exception:  # connection refused or reset while the API server restarts
                self.reconnects += 1
                time.sleep(0.2)

    def _record(self, meta: Any, data: Mapping[str, str] | None) -> None:
        if not meta.name.endswith("-assignment") or meta.resource_version in self._versions:
            return
        text = (data or {}).get(CONFIGMAP_KEY)
        if text is None:
            return
        with self._lock:
            self._versions.add(meta.resource_version)
            try:
                doc = AssignmentDocument.decode(text)
            except DocumentError as e:
                self.problems.append(f"{meta.name}@{meta.resource_version}: undecodable: {e}")
                return
            readable = {t: list(self.readable.get(t, ())) for t in doc.topics}
            revoked = [mq for r in doc.releasing for mq in r.queues]
            for problem in assignment_problems(
                doc.strategy, doc.message_model, doc.members, doc.topics, readable, revoked
            ):
                self.problems.append(f"{doc.group} generation {doc.generation}: {problem}")
            items = self.seen.setdefault(meta.name.removesuffix("-assignment"), [])
            if items and items[-1].generation == doc.generation and items[-1].members == tuple(doc.members):
                # The same document rewritten only for foreign metadata (a test's own writes).
                return
            annotations = meta.annotations or {}
            self.documents.setdefault(meta.name.removesuffix("-assignment"), []).append(doc)
            items.append(
                Seen(
                    meta.name.removesuffix("-assignment"),
                    doc.generation,
                    meta.resource_version,
                    annotations.get(PUBLISHED_BY),
                    tuple(sorted(doc.members)),
                )
            )


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
    api: client.ApiClient, namespace: str, group: str, members: Iterable[str], timeout: float = 60.0
) -> AssignmentDocument:
    want = set(members)
    return wait_for(
        f"{namespace}/{group} to publish members {sorted(want)}",
        lambda: converged(api, namespace, group, want),
        timeout,
    )


def owner_count(doc: AssignmentDocument) -> dict[MessageQueue, int]:
    counts: dict[MessageQueue, int] = {}
    for assignment in doc.topics.values():
        for queues in assignment.values():
            for mq in queues:
                counts[mq] = counts.get(mq, 0) + 1
    return counts
