"""Crash safety of the handover (revoke, release, then assign) with real sidecars.

Every pod runs a real sidecar and an application acted out by a thread: it follows its sidecar,
holds exactly its share and acknowledges each generation (``POST /v1/release``) while the test
lets it; a leaving one holds nothing and acknowledges with ``all``. The release timeout is 600 s,
so every handover must complete by a release or because the old owner is gone, never by the
timeout. Disruptions land between the two steps (after a revocation is published, before the
assignment): the operator is SIGKILLed, the API server is restarted, an old owner's pod is
deleted before it acknowledges. Checked throughout: no published document gives a queue to two
members or holds a revoked one (``GenerationWatcher``); across consecutive generations no queue
goes straight from a live owner that has not let go to another member; and afterwards every
queue is owned again, nothing is left releasing, nothing was overridden.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.apps.operator import OperatorProcess
from harness.apps.sidecar import SidecarProcess
from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument, decode_acks, releases_configmap_name
from mqbalance.model import MessageQueue
from mqbalance.sidecar.client import SidecarError
from mqbalance.sidecar.config import DEFAULT_MAX_WAIT
from tests.integration.operator_support import apply_group, read_document, status_for
from tests.integration.reliability.reliability_support import (
    Rig,
    handover_problems,
    owner_count,
    release_problems,
)

GROUP = "handover"
LABELS = {"app": GROUP}
SPEC: dict[str, Any] = {
    "topics": ["orders", "payments"],
    "strategy": {"name": "STICKY"},
    "debounceSeconds": 0,
    "selector": {"matchLabels": LABELS},
    "handover": {"mode": "Release", "releaseTimeoutSeconds": 600},
}


class App:
    """A pod's application: follows its sidecar, holds exactly its share, and acknowledges each
    generation while ``acking`` is set; once ``leaving`` it holds nothing and says ``all``."""

    def __init__(self, pod: str, sidecar: SidecarProcess) -> None:
        self.pod = pod
        self.sidecar = sidecar
        self.acking = threading.Event()
        self.leaving = False
        self.acked: tuple[int, bool] = (-1, False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"app-{pod}", daemon=True)

    def start(self, acking: bool) -> None:
        if acking:
            self.acking.set()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.acking.is_set():
                try:
                    generation = int(self.sidecar.client.queues()["generation"])
                    wanted = (generation, self.leaving)
                    if wanted != self.acked:
                        self.sidecar.client.release(generation, all=self.leaving)
                        self.acked = wanted
                except SidecarError:
                    pass  # starting, or the API server is away (503): again shortly
            self._stop.wait(0.05)


@dataclass
class Fleet:
    """The group's pods, each with a sidecar and an application."""

    cluster: LocalCluster
    api: client.ApiClient
    namespace: str
    nodes: list[str]
    logs: Path
    apps: dict[str, App] = field(default_factory=dict)
    members: set[str] = field(default_factory=set)
    """Pods that are Ready and not terminating."""
    departed: set[str] = field(default_factory=set)
    """Pods deleted or whose application let go of everything: their queues may move in one step."""
    acking: bool = True
    _names: Iterator[int] = field(default_factory=itertools.count)

    def join(self) -> str:
        name = f"{GROUP}-{next(self._names)}"
        kubelet.create_pod(self.api, self.namespace, name, LABELS)
        kubelet.bind_pod(self.api, self.namespace, name, self.nodes[len(self.apps) % len(self.nodes)])
        sidecar = SidecarProcess(
            self.cluster.kubeconfig, self.logs / f"sidecar-{name}.log",
            "--pod-name", name, "--namespace", self.namespace, "--group", GROUP, "--no-topics",
            metrics=False, env={"MQBALANCE_LOG_LEVEL": "INFO"},
        )  # fmt: skip
        sidecar.start()
        app = App(name, sidecar)
        app.start(self.acking)
        self.apps[name] = app
        kubelet.set_pod_ready(self.api, self.namespace, name, True)
        self.members.add(name)
        return name

    def start_leaving(self, name: str) -> None:
        """The pod is deleted (Terminating: no member any more); its application shuts down."""
        self.members.discard(name)
        self.departed.add(name)
        kubelet.mark_terminating(self.api, self.namespace, name)
        self.apps[name].leaving = True

    def finish_leaving(self, name: str, *, drained: bool = True) -> None:
        """The preStop drain returns (``drained``: because the pod handed everything over, not at
        its timeout), the containers stop, the pod goes."""
        app = self.apps.pop(name)
        if drained:
            drain = scaled(30, at_most=DEFAULT_MAX_WAIT)
            assert app.sidecar.client.drain(timeout=drain)["drained"] is True, f"{name} did not drain"
        app.stop()
        app.sidecar.stop()
        kubelet.delete_pod(self.api, self.namespace, name, wait=False)

    def kill(self, name: str) -> None:
        """The node under the pod is lost: nothing acknowledges, the pod is deleted."""
        self.members.discard(name)
        self.departed.add(name)
        app = self.apps.pop(name)
        app.stop()
        app.sidecar.kill()
        kubelet.delete_pod(self.api, self.namespace, name, wait=False)

    def hold_acks(self) -> None:
        self.acking = False
        for app in self.apps.values():
            app.acking.clear()

    def resume_acks(self) -> None:
        self.acking = True
        for app in self.apps.values():
            app.acking.set()

    def stop(self) -> None:
        for app in self.apps.values():
            app.stop()
            app.sidecar.stop()


@pytest.fixture
def fleet(
    cluster: LocalCluster, api_client: client.ApiClient, namespace: str, nodes: list[str], tmp_path: Path
) -> Iterator[Fleet]:
    f = Fleet(cluster, api_client, namespace, nodes, tmp_path)
    yield f
    f.stop()


def document(api: client.ApiClient, namespace: str) -> AssignmentDocument:
    doc = read_document(api, namespace, GROUP)
    assert doc is not None, "no assignment published"
    return doc


def settled(
    api: client.ApiClient,
    namespace: str,
    members: set[str],
    queues: list[MessageQueue],
    timeout: float = 60.0,
) -> AssignmentDocument:
    """Wait for the document naming exactly ``members``, with nothing releasing and every queue owned."""

    def probe() -> AssignmentDocument | None:
        doc = read_document(api, namespace, GROUP)
        if doc is None or set(doc.members) != members or doc.releasing:
            return None
        counts = owner_count(doc)
        return doc if sorted(counts) == sorted(queues) and set(counts.values()) == {1} else None

    return wait_for(f"the handover to settle on {sorted(members)}", probe, timeout)


def revocation_after(api: client.ApiClient, namespace: str, generation: int) -> AssignmentDocument:
    """The first document after ``generation`` that revokes queues (the handover's first step)."""

    def probe() -> AssignmentDocument | None:
        doc = read_document(api, namespace, GROUP)
        return doc if doc is not None and doc.generation > generation and doc.releasing else None

    return wait_for(f"a revocation after generation {generation}", probe, 60)


def acks_recorded(api: client.ApiClient, namespace: str, doc: AssignmentDocument) -> bool:
    """Every owner that ``doc`` revoked from has acknowledged it (in the releases ConfigMap)."""
    cm = client.CoreV1Api(api).read_namespaced_config_map(releases_configmap_name(GROUP), namespace)
    acks = decode_acks(cm.data)
    return all(r.owner in acks and acks[r.owner].generation >= r.generation for r in doc.releasing)


def wait_acks(api: client.ApiClient, namespace: str, doc: AssignmentDocument) -> None:
    what = f"the acknowledgements of generation {doc.generation}"
    wait_for(what, lambda: acks_recorded(api, namespace, doc))


def all_queues(topics: dict[str, list[MessageQueue]]) -> list[MessageQueue]:
    return [mq for t in SPEC["topics"] for mq in topics[t]]


Round = Callable[[int, random.Random, OperatorProcess, list[MessageQueue]], OperatorProcess]
"""One round of a reliability driver: its index, the seeded random source, the operator running
and the group's queues in; the operator running after it out."""


@dataclass(frozen=True)
class HandoverRig(Rig):
    """A reliability test's rig (:class:`Rig`) with the fleet of pods of the handover group."""

    fleet: Fleet

    def begin(self) -> tuple[list[MessageQueue], OperatorProcess]:
        """The group with two members, settled, and its operator running: every test's start."""
        queues = all_queues(self.topics)
        apply_group(self.api, self.namespace, GROUP, SPEC)
        self.fleet.join()
        self.fleet.join()
        op = self.start_operator()
        self.settled(queues)
        return queues, op

    def rounds(
        self, rounds: int, seed: int, one: Round, max_outages: int = 0, min_handed_on: int = 0
    ) -> dict[str, int]:
        """The group begun (:meth:`begin`), ``one`` round run ``rounds`` times (it returns the operator
        running after it), the operator stopped; the figures (:meth:`check_clean`)."""
        rng = random.Random(seed)
        queues, op = self.begin()
        for i in range(rounds):
            op = one(i, rng, op, queues)
        self.stop_operator(op)
        return self.check_clean(op, rounds, max_outages, min_handed_on)

    def settled(self, queues: list[MessageQueue]) -> AssignmentDocument:
        """The document naming exactly the fleet's members, nothing releasing (:func:`settled`)."""
        return settled(self.api, self.namespace, self.fleet.members, queues)

    def document(self) -> AssignmentDocument:
        return document(self.api, self.namespace)

    def stop_operator(self, op: OperatorProcess) -> None:
        """Stop ``op`` once the status describes the last published generation: the operator writes
        the status after the ConfigMap, so a stop in between would leave the status behind for good
        and :meth:`check_clean` waiting for it."""
        status_for(self.api, self.namespace, GROUP, self.document().generation)
        op.stop()

    def check_clean(
        self, op: OperatorProcess, rounds: int, max_outages: int = 0, min_handed_on: int = 0
    ) -> dict[str, int]:
        """Every generation checked, by the watcher and across each consecutive two; at least the
        ones the test caused: the first assignment, and per round the revoking generation and the
        one assigning what was released; at least ``min_handed_on`` revoked queues of live owners
        checked to have been handed on after their owner released them. The figures."""
        api, namespace, watcher = self.api, self.namespace, self.watcher
        latest = read_document(api, namespace, GROUP)
        assert latest is not None
        watcher.wait_seen(GROUP, latest.generation)
        caused = 1 + 2 * rounds
        figures = watcher.assert_clean(
            min_generations=caused, max_outages=max_outages, journal=op.journal_records()
        )
        problems, pairs = handover_problems(watcher.history(GROUP), self.fleet.departed)
        released, handed_on = release_problems(watcher.history(GROUP), self.fleet.departed)
        problems += released
        assert not problems, "\n".join(problems)
        assert pairs >= caused - 1, (
            f"only {pairs} pairs of consecutive generations compared ({caused} caused)"
        )
        assert handed_on >= min_handed_on, (
            f"only {handed_on} revoked queues of live owners checked ({min_handed_on} expected)"
        )
        handover = status_for(api, namespace, GROUP, latest.generation).get("handover") or {}
        assert handover.get("overriddenQueues", 0) == 0, f"a release was overridden: {handover}"
        return {
            "generations_checked": figures.generations_checked,
            "pairs_compared": pairs,
            "released_queues_checked": handed_on,
            "gaps_from_journal": figures.generations_from_journal,
            "watch_outages": figures.outages,
        }


@pytest.fixture
def handover_rig(rig: Rig, fleet: Fleet) -> HandoverRig:
    return HandoverRig(rig.api, rig.namespace, rig.nodes, rig.topics, rig.watcher, rig.start_operator, fleet)


def figures_line(what: str, figures: dict[str, int]) -> str:
    return f"handover {what} figures: " + " ".join(f"{k}={v}" for k, v in figures.items())


def change(fleet: Fleet, rng: random.Random) -> tuple[str, str]:
    """A join, or a clean leave, keeping two to four members."""
    if len(fleet.members) <= 2 or (len(fleet.members) < 4 and rng.random() < 0.5):
        return "join", fleet.join()
    leaving = rng.choice(sorted(fleet.members))
    fleet.start_leaving(leaving)
    return "leave", leaving


def change_held(
    api: client.ApiClient, namespace: str, fleet: Fleet, rng: random.Random
) -> tuple[str, str, AssignmentDocument]:
    """With every acknowledgement held, a change (:func:`change`) and the generation revoking for it."""
    fleet.hold_acks()
    generation = document(api, namespace).generation
    what, pod = change(fleet, rng)
    return what, pod, revocation_after(api, namespace, generation)


KILL_POINTS = ("before-acks", "after-acks", "while-acking")


def operator_kill_rounds(rig: HandoverRig, rounds: int, seed: int) -> dict[str, int]:
    api, namespace, fleet = rig.api, rig.namespace, rig.fleet

    def one(i: int, rng: random.Random, op: OperatorProcess, queues: list[MessageQueue]) -> OperatorProcess:
        what, pod, revoked = change_held(api, namespace, fleet, rng)
        # Nobody has released: the operator keeps the revoked queues from everyone.
        time.sleep(0.5)
        pending = {mq for r in rig.document().releasing for mq in r.queues}
        assert pending >= {mq for r in revoked.releasing for mq in r.queues}, "assigned before the release"
        point = KILL_POINTS[i % len(KILL_POINTS)]
        if point == "before-acks":
            op.kill()  # the revocation is out, nobody has acknowledged it
            frozen = rig.document()
            fleet.resume_acks()
            wait_acks(api, namespace, frozen)
            assert rig.document().generation == frozen.generation, "assigned with no operator"
        elif point == "after-acks":
            fleet.resume_acks()
            wait_acks(api, namespace, revoked)
            op.kill()  # the assignment may or may not be out
        else:
            fleet.resume_acks()
            time.sleep(rng.uniform(0.0, 0.3))
            op.kill()
        if what == "leave" and rng.random() < 0.5:
            # The pod goes while no operator runs (its drain gave up at its timeout).
            fleet.finish_leaving(pod, drained=False)
            what = "gone"
        op = rig.start_operator()
        rig.settled(queues)
        if what == "leave":
            fleet.finish_leaving(pod)
        return op

    # The first round is a join (two members begin): their queues are handed on at their release
    # (the others' may go back to their owners, or belong to a leaver, which needs no release).
    return {"kills": rounds, "rounds": rounds, **rig.rounds(rounds, seed, one, min_handed_on=1)}


@pytest.mark.parametrize(
    ("rounds", "seed"),
    [pytest.param(6, 5, id="default"), pytest.param(30, 2025, marks=pytest.mark.slow, id="long")],
)
def test_operator_killed_between_revoke_and_assign(rounds: int, seed: int, handover_rig: HandoverRig) -> None:
    print(figures_line("operator-kill", operator_kill_rounds(handover_rig, rounds, seed)))


def apiserver_rounds(rig: HandoverRig, cluster: LocalCluster, rounds: int, seed: int) -> dict[str, int]:
    fleet = rig.fleet

    def one(i: int, rng: random.Random, op: OperatorProcess, queues: list[MessageQueue]) -> OperatorProcess:
        what, pod, _ = change_held(rig.api, rig.namespace, fleet, rng)
        # The API server goes away while the applications acknowledge (their sidecars answer
        # 503 and they retry) and the operator waits for the acknowledgements. (Restarted from
        # this thread: the API server dies with the thread that started it.)
        resume = threading.Timer(rng.uniform(0.0, 0.5), fleet.resume_acks)
        resume.start()
        cluster.restart_apiserver(kill=i % 2 == 1)
        resume.join()
        rig.settled(queues)
        if what == "leave":
            fleet.finish_leaving(pod)
        assert op.alive, f"the operator died:\n{op.tail()}"
        return op

    # A restart (one a round) breaks the watch once (refused until the new API server listens), or
    # twice when the stopping server still answered a new watch request before it went.
    return {"restarts": rounds, **rig.rounds(rounds, seed, one, max_outages=2 * rounds)}


@pytest.mark.parametrize(
    ("rounds", "seed"),
    [pytest.param(2, 3, id="default"), pytest.param(10, 31, marks=pytest.mark.slow, id="long")],
)
def test_api_server_restarted_during_a_handover(
    rounds: int, seed: int, cluster: LocalCluster, handover_rig: HandoverRig
) -> None:
    print(figures_line("api-restart", apiserver_rounds(handover_rig, cluster, rounds, seed)))


def owner_death_rounds(rig: HandoverRig, rounds: int, seed: int) -> dict[str, int]:
    api, namespace, fleet = rig.api, rig.namespace, rig.fleet

    def one(i: int, rng: random.Random, op: OperatorProcess, queues: list[MessageQueue]) -> OperatorProcess:
        fleet.hold_acks()
        generation = rig.document().generation
        fleet.join()
        revoked = revocation_after(api, namespace, generation)
        victim = rng.choice(sorted({r.owner for r in revoked.releasing}))
        down = i % 2 == 1
        if down:
            op.kill()  # the owner dies while no operator runs, too
        fleet.kill(victim)
        if down:
            op = rig.start_operator()
        # The victim's queues need no release any more; the others' still do.
        started = time.monotonic()
        fleet.resume_acks()
        rig.settled(queues)
        waited = time.monotonic() - started
        assert waited < 60, f"the handover took {waited:.0f} s: it waited for the dead owner"
        if len(fleet.members) > 3:
            leaving = rng.choice(sorted(fleet.members))
            fleet.start_leaving(leaving)
            rig.settled(queues)
            fleet.finish_leaving(leaving)
        return op

    return {"deaths": rounds, **rig.rounds(rounds, seed, one)}


@pytest.mark.parametrize(
    ("rounds", "seed"),
    [pytest.param(2, 8, id="default"), pytest.param(10, 99, marks=pytest.mark.slow, id="long")],
)
def test_an_old_owner_that_dies_before_it_releases_needs_no_release(
    rounds: int, seed: int, handover_rig: HandoverRig
) -> None:
    print(figures_line("owner-death", owner_death_rounds(handover_rig, rounds, seed)))
