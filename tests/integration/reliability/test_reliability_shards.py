"""Three operator replicas share the groups through shard Leases: every replica works, each group
is published by one replica at a time, and a SIGKILLed replica's shards are taken over once their
Leases expire, with no duplicate or backward generation anywhere."""

from __future__ import annotations

import json
import random
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes import client

from harness.polling import wait_for
from harness.processes import OperatorProcess
from mqbalance.model import MessageQueue
from mqbalance.operator.shards import shard_of
from tests.integration.operator_support import apply_group
from tests.integration.reliability.reliability_support import Churn, GenerationWatcher, wait_converged

PREFIX = "mqbalance-shards"
SHARDS = 6
DURATION = 4
GROUPS = [f"g{i}" for i in range(12)]


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


def test_replicas_split_the_groups_and_take_over_a_killed_ones_shards(
    api_client: client.ApiClient,
    namespace: str,
    nodes: list[str],
    topics: dict[str, list[MessageQueue]],
    watcher: GenerationWatcher,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    rng = random.Random(17)
    for group in GROUPS:
        spec = {"topics": ["orders"], "strategy": {"name": "STICKY"}, "debounceSeconds": 0}
        apply_group(api_client, namespace, group, {**spec, "selector": {"matchLabels": {"app": group}}})
    churn = Churn(api_client, namespace, GROUPS, nodes, rng)
    for group in GROUPS:
        churn.add(group)
        churn.add(group)
    args = ("--leader-election", PREFIX, "--shards", str(SHARDS), "--lease-duration", str(DURATION))
    replicas = [start_operator(*args, name=f"replica-{i}") for i in range(3)]
    held = wait_for("every shard held by one of three replicas", lambda: split(replicas, 3), DURATION * 5)
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group))
    for group in GROUPS:  # a change for every group, now that the shards are dealt
        churn.add(group)
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group))
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
    wait_for("the survivors to hold every shard", lambda: split(survivors, 2), DURATION * 5)
    for group in orphaned:
        wait_converged(api_client, namespace, group, churn.members(group), timeout=DURATION * 5)
    takeover = time.monotonic() - killed
    for _ in range(8):
        churn.step()
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group))

    # No group was published by two replicas at once: every generation once, by one replica.
    watcher.assert_clean()
    seen = Counter((r.group, r.generation) for op in replicas for r in op.journal_records())
    twice = [key for key, n in seen.items() if n > 1]
    assert not twice, f"generations published by two replicas: {twice}"
    for op in survivors:
        assert op.alive
        assert op.metric("mqbalance_reconcile_errors_total", kind="conflict") == 0, op.tail(100)
    print(
        f"shard figures: takeover_seconds={takeover:.1f} lease_duration={DURATION} shards={SHARDS}",
        f"orphaned_groups={len(orphaned)} generations={len(seen)}",
    )
