"""Two operator replicas elect a leader through a Lease: only the holder writes; after the holder
is killed the standby takes over once the Lease expires, with no duplicate or backward generation."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from kubernetes import client
from operator_support import apply_group, wait_for
from reliability_support import Churn, GenerationWatcher, KillableOperator, wait_converged

from mqbalance.model import MessageQueue

LEASE = "mqbalance-operator"
DURATION = 4
GROUPS = {
    "sticky": {"topics": ["orders", "payments"], "strategy": {"name": "STICKY"}, "debounceSeconds": 0},
    "avg": {"topics": ["orders"], "strategy": {"name": "AVG"}, "debounceSeconds": 0},
}


def lease(api: client.ApiClient, namespace: str) -> client.V1Lease | None:
    try:
        return client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
    except client.exceptions.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_only_the_lease_holder_writes_and_a_standby_takes_over(
    api_client: client.ApiClient,
    namespace: str,
    nodes: list[str],
    topics: dict[str, list[MessageQueue]],
    watcher: GenerationWatcher,
    start_operator: Callable[..., KillableOperator],
) -> None:
    rng = random.Random(5)
    for group, spec in GROUPS.items():
        apply_group(api_client, namespace, group, {**spec, "selector": {"matchLabels": {"app": group}}})
    churn = Churn(api_client, namespace, list(GROUPS), nodes, rng)
    for group in GROUPS:
        churn.add(group)
    args = ("--leader-election", LEASE, "--lease-duration", str(DURATION))
    first = start_operator(*args, name="first")
    wait_for("a lease holder", lambda: (lease(api_client, namespace) or client.V1Lease()).spec)
    second = start_operator(*args, name="second")  # healthy as a standby
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group))
    for _ in range(6):
        churn.step()
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group))
    holder = lease(api_client, namespace).spec.holder_identity
    assert first.journal_records(), "the first replica published nothing"
    assert not second.journal_records(), "the standby published"
    assert "standing by" in second.tail(200)

    killed = time.monotonic()
    first.kill()
    churn.step()
    wait_for(
        "the standby to take the lease",
        lambda: lease(api_client, namespace).spec.holder_identity not in (None, holder),
        timeout=DURATION * 5,
    )
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group))
    takeover = time.monotonic() - killed
    assert second.journal_records(), "the new leader published nothing"
    for _ in range(4):
        churn.step()
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group))
    spec = lease(api_client, namespace).spec
    assert spec.lease_transitions == 1, f"the lease changed hands {spec.lease_transitions} times"
    assert second.alive
    watcher.assert_clean()
    print(
        f"leader figures: takeover_seconds={takeover:.1f} lease_duration={DURATION}",
        f"transitions={spec.lease_transitions}",
    )
