"""Three operator replicas share the groups through shard Leases: every replica works, each group
is published by one replica at a time, and a SIGKILLed replica's shards are taken over once their
Leases expire, with no duplicate or backward generation anywhere."""

from __future__ import annotations

import contextlib
import json
import random
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.apps.operator import OperatorProcess
from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for
from mqbalance.operator.shards import shard_of
from tests.integration.operator_support import apply_topic
from tests.integration.reliability.conftest import TOPICS, readable_queues
from tests.integration.reliability.reliability_support import (
    Caused,
    Churn,
    GenerationWatcher,
    Rig,
    start_churn,
    wait_converged,
)

PREFIX = "mqbalance-shards"
SHARDS = 6
DURATION = 4
"""The shard Leases' duration on an idle machine (--lease-duration); :func:`lease_duration` stretches it."""


def lease_duration() -> int:
    """DURATION stretched on a loaded machine (at most 20 s): a renewal the machine delays past the lease
    hands a live replica's shards on, and the split the test checks moves under it."""
    return max(DURATION, min(20, round(scaled(DURATION))))


GROUPS = [f"g{i}" for i in range(12)]
GROUP_SPEC = {"topics": ["orders"], "strategy": {"name": "STICKY"}, "debounceSeconds": 0}


def health(op: OperatorProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/healthz", timeout=5) as answer:
        found: dict[str, Any] = json.load(answer)
        return found


def shards_held(replicas: list[OperatorProcess]) -> dict[str, list[int]]:
    return {op.workdir.name: list(health(op).get("shards", [])) for op in replicas}


def split(replicas: list[OperatorProcess], members: int) -> dict[str, list[int]] | None:
    """The shards each replica holds, once every shard is held by exactly one of ``members`` replicas."""
    held = shards_held(replicas)
    counts = Counter(s for shards in held.values() for s in shards)
    busy = [name for name, shards in held.items() if shards]
    if sorted(counts) == list(range(SHARDS)) and max(counts.values()) == 1 and len(busy) == members:
        return held
    return None


def test_replicas_split_the_groups_and_take_over_a_killed_ones_shards(rig: Rig) -> None:
    api_client, namespace = rig.api, rig.namespace
    rng = random.Random(17)
    caused = Caused()
    churn = start_churn(api_client, namespace, rig.nodes, rng, dict.fromkeys(GROUPS, GROUP_SPEC), pods=2)
    duration = lease_duration()
    args = ("--leader-election", PREFIX, "--shards", str(SHARDS), "--lease-duration", str(duration))
    replicas = [rig.start_operator(*args, name=f"replica-{i}") for i in range(3)]
    held = wait_for("every shard held by one of three replicas", lambda: split(replicas, 3), duration * 5)
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group), caused=caused)
    for group in GROUPS:  # a change for every group, now that the shards are dealt
        churn.add(group)
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group), caused=caused)
    # Each group's latest generation came from the replica holding its shard: the work is split.
    latest: dict[str, tuple[int, str]] = {}
    for op in replicas:
        for record in op.journal_records():
            if record.generation > latest.get(record.group, (0, ""))[0]:
                latest[record.group] = (record.generation, op.workdir.name)
    for group in GROUPS:
        owner = next(name for name, shards in held.items() if shard_of(namespace, group, SHARDS) in shards)
        assert latest[group][1] == owner, (group, latest[group], held)

    victim = max(replicas, key=lambda op: len(held[op.workdir.name]))
    orphaned = [g for g in GROUPS if shard_of(namespace, g, SHARDS) in held[victim.workdir.name]]
    killed = time.monotonic()
    victim.kill()
    for group in orphaned:  # work only the dead replica's shards could do
        churn.add(group)
    survivors = [op for op in replicas if op is not victim]
    wait_for("the survivors to hold every shard", lambda: split(survivors, 2), duration * 5)
    for group in orphaned:
        wait_converged(
            api_client, namespace, group, churn.members(group), timeout=duration * 5, caused=caused
        )
    takeover = time.monotonic() - killed
    for _ in range(8):
        churn.step()
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group), caused=caused)

    # No group was published by two replicas at once: every generation once, by one replica.
    caused.check(rig.watcher, [r for op in replicas for r in op.journal_records()])
    seen = assert_one_writer(replicas, survivors)
    print(
        f"shard figures: takeover_seconds={takeover:.1f} lease_duration={duration} shards={SHARDS}",
        f"orphaned_groups={len(orphaned)} generations={len(seen)}",
    )


def test_replicas_sharding_by_namespace_watch_only_their_namespaces(
    cluster: LocalCluster,
    api_client: client.ApiClient,
    namespace: str,
    nodes: list[str],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """--shard-by namespace with --all-namespaces: each replica lists and watches only the
    namespaces of the shards it holds, a namespace created later is taken up by its shard's
    holder, and a SIGKILLed replica's namespaces move to the others."""
    rng = random.Random(23)
    duration = lease_duration()
    core = client.CoreV1Api(api_client)
    namespaces = [namespace, *(f"{namespace[:50]}-{i}" for i in range(1, 6))]
    for ns in namespaces[1:]:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    watchers: list[GenerationWatcher] = []
    churns: dict[str, Churn] = {}
    caused: dict[str, Caused] = {ns: Caused() for ns in namespaces}
    try:
        for ns in namespaces:
            for name, brokers in TOPICS.items():
                apply_topic(api_client, ns, name, brokers)
            watchers.append(GenerationWatcher(api_client, ns, readable_queues()).start())
            churns[ns] = start_groups(api_client, ns, nodes, rng)
        args: tuple[str, ...] = ("--leader-election", PREFIX, "--shards", str(SHARDS))
        args += (
            "--lease-duration",
            str(duration),
            "--shard-by",
            "namespace",
            "--lease-namespace",
            namespace,
            "--all-namespaces",
        )
        replicas = [start_operator(*args, name=f"replica-{i}", namespaces=[]) for i in range(3)]
        held = wait_for("every shard held by one of three replicas", lambda: split(replicas, 3), duration * 5)

        wait_watching(replicas, held, churns, "each replica to watch the namespaces of its shards")
        converge_all(api_client, churns, caused)
        for churn in churns.values():  # a change for every group, now that the shards are dealt
            for group in churn.groups:
                churn.add(group)
        converge_all(api_client, churns, caused)
        # Each group's latest generation came from the replica holding its namespace's shard.
        latest: dict[tuple[str, str], tuple[int, OperatorProcess]] = {}
        for op in replicas:
            for record in op.journal_records():
                key = (record.namespace, record.group)
                if record.namespace in churns and record.generation > latest.get(key, (0, op))[0]:
                    latest[key] = (record.generation, op)
        for (ns, group), (_, op) in latest.items():
            assert ns in served_by(op, held, churns), (ns, group, op.workdir.name, held)
        assert len(latest) == 2 * len(churns)

        # A namespace created now is served by its shard's holder.
        late = f"{namespace[:50]}-late"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=late)))
        namespaces.append(late)
        caused[late] = Caused()
        for name, brokers in TOPICS.items():
            apply_topic(api_client, late, name, brokers)
        watchers.append(GenerationWatcher(api_client, late, readable_queues()).start())
        churns[late] = start_groups(api_client, late, nodes, rng)
        converge_all(api_client, {late: churns[late]}, caused)
        wait_watching(replicas, held, churns, "the new namespace watched by its shard's holder")

        victim = max(replicas, key=lambda op: len(served_by(op, held, churns)))
        orphaned = served_by(victim, held, churns)
        assert orphaned, held
        killed = time.monotonic()
        victim.kill()
        for ns in orphaned:  # work only the dead replica's namespaces need
            for group in churns[ns].groups:
                churns[ns].add(group)
        survivors = [op for op in replicas if op is not victim]
        held = wait_for("the survivors to hold every shard", lambda: split(survivors, 2), duration * 5)
        converge_all(api_client, {ns: churns[ns] for ns in orphaned}, caused, timeout=duration * 5)
        takeover = time.monotonic() - killed
        wait_watching(survivors, held, churns, "the survivors to watch the namespaces of their shards")
        for churn in churns.values():
            for _ in range(3):
                churn.step()
        converge_all(api_client, churns, caused)

        # No group was published by two replicas at once: every generation once, by one replica.
        journal = [r for op in replicas for r in op.journal_records()]
        for w in watchers:
            caused[w.namespace].check(w, journal)
        assert_one_writer(replicas, survivors)
        print(
            f"namespace shard figures: takeover_seconds={takeover:.1f} lease_duration={duration}",
            f"shards={SHARDS} namespaces={len(churns)} orphaned_namespaces={len(orphaned)}",
        )
    finally:
        for w in watchers:
            w.stop()
        for ns in namespaces[1:]:
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns)


def start_groups(api: client.ApiClient, namespace: str, nodes: list[str], rng: random.Random) -> Churn:
    """Two groups of the namespace, each with two Ready pods."""
    return start_churn(api, namespace, nodes, rng, dict.fromkeys(("g0", "g1"), GROUP_SPEC), pods=2)


def converge_all(
    api: client.ApiClient, churns: dict[str, Churn], caused: dict[str, Caused], timeout: float = 60.0
) -> None:
    for ns, churn in churns.items():
        for group in churn.groups:
            wait_converged(api, ns, group, churn.members(group), timeout=timeout, caused=caused[ns])


def served_by(op: OperatorProcess, held: dict[str, list[int]], churns: dict[str, Churn]) -> list[str]:
    """Our namespaces whose shard ``op`` holds in ``held``."""
    shards = held[op.workdir.name]
    return [ns for ns in churns if shard_of(ns, "", SHARDS, "namespace") in shards]


def wait_watching(
    replicas: list[OperatorProcess], held: dict[str, list[int]], churns: dict[str, Churn], what: str
) -> None:
    """Until each replica watches exactly those of our namespaces its shards hold."""

    def watching() -> bool:
        return all(
            {ns for ns in health(op).get("namespaces", []) if ns in churns}
            == set(served_by(op, held, churns))
            for op in replicas
        )

    wait_for(what, watching, 30)


def assert_one_writer(
    replicas: list[OperatorProcess], survivors: list[OperatorProcess]
) -> Counter[tuple[str, str, int]]:
    """Every (namespace, group, generation) in one replica's journal only, and no survivor had a write
    conflict: no group was published by two replicas at once. The generations seen."""
    seen = Counter((r.namespace, r.group, r.generation) for op in replicas for r in op.journal_records())
    twice = [key for key, n in seen.items() if n > 1]
    assert not twice, f"generations published by two replicas: {twice}"
    for op in survivors:
        assert op.alive
        assert op.metric("mqbalance_reconcile_errors_total", kind="conflict") == 0, op.tail(100)
    return seen
