"""Two operator replicas elect a leader through a Lease: only the holder writes; after the holder
is killed the standby takes over once the Lease expires, with no duplicate or backward generation."""

from __future__ import annotations

import random
import time

from kubernetes import client

from harness.polling import scaled, wait_for
from tests.integration.reliability.reliability_support import Caused, Rig, start_churn, wait_converged

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


def lease_spec(api: client.ApiClient, namespace: str) -> client.V1LeaseSpec:
    """The Lease's spec; an empty one while there is no Lease."""
    found = lease(api, namespace)
    return (found.spec if found else None) or client.V1LeaseSpec()


def test_only_the_lease_holder_writes_and_a_standby_takes_over(rig: Rig) -> None:
    api_client, namespace = rig.api, rig.namespace
    rng = random.Random(5)
    caused = Caused()
    churn = start_churn(api_client, namespace, rig.nodes, rng, GROUPS)
    args = ("--leader-election", LEASE, "--lease-duration", str(DURATION))
    first = rig.start_operator(*args, name="first")
    wait_for("a lease holder", lambda: lease_spec(api_client, namespace).holder_identity)
    second = rig.start_operator(*args, name="second")  # healthy as a standby
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group), caused=caused)
    for _ in range(6):
        churn.step()
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group), caused=caused)
    holder = lease_spec(api_client, namespace).holder_identity
    assert first.journal_records(), "the first replica published nothing"
    assert not second.journal_records(), "the standby published"
    assert "standing by" in second.tail(200)

    killed = time.monotonic()
    first.kill()
    churn.step()
    wait_for(
        "the standby to take the lease",
        lambda: lease_spec(api_client, namespace).holder_identity not in (None, holder),
        timeout=DURATION * 5,
    )
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group), caused=caused)
    takeover = time.monotonic() - killed
    assert second.journal_records(), "the new leader published nothing"
    for _ in range(4):
        churn.step()
    for group in GROUPS:
        wait_converged(api_client, namespace, group, churn.members(group), caused=caused)
    transitions = lease_spec(api_client, namespace).lease_transitions
    assert transitions == 1, f"the lease changed hands {transitions} times"
    assert second.alive
    checked = caused.check(rig.watcher, [*first.journal_records(), *second.journal_records()])
    print(
        f"leader figures: takeover_seconds={takeover:.1f} lease_duration={DURATION}",
        f"transitions={transitions} generations_checked={checked.generations_checked}",
    )


def test_sigterm_releases_the_lease_for_an_immediate_takeover(rig: Rig) -> None:
    """What a rolling update relies on: the stopping pod releases the Lease, so the new one does
    not wait for it to expire (a duration long enough that waiting would show)."""
    api_client, namespace = rig.api, rig.namespace
    duration = 60
    rng = random.Random(6)
    caused = Caused()
    group = "sticky"
    churn = start_churn(api_client, namespace, rig.nodes, rng, {group: GROUPS[group]})
    args = ("--leader-election", LEASE, "--lease-duration", str(duration))
    first = rig.start_operator(*args, name="first")
    wait_converged(api_client, namespace, group, churn.members(group), caused=caused)
    holder = lease_spec(api_client, namespace).holder_identity
    assert holder

    assert first.proc is not None
    stopped = time.monotonic()
    first.proc.terminate()
    assert first.proc.wait(timeout=scaled(30)) == 0, first.tail()
    first.proc = None
    released = lease_spec(api_client, namespace)
    # Released as client-go releases on cancel: no holder, a one-second duration.
    assert not released.holder_identity, "SIGTERM did not release the lease"
    assert released.lease_duration_seconds == 1

    churn.step()
    second = rig.start_operator(*args, name="second")
    wait_for(
        "the second replica to take the lease",
        lambda: lease_spec(api_client, namespace).holder_identity not in (None, holder),
        timeout=duration / 2,
    )
    wait_converged(api_client, namespace, group, churn.members(group), caused=caused)
    handover = time.monotonic() - stopped
    assert "standing by" not in second.tail(200), "the second replica waited for the released lease"
    assert second.journal_records(), "the new leader published nothing"
    assert lease_spec(api_client, namespace).lease_transitions == 1
    checked = caused.check(rig.watcher, [*first.journal_records(), *second.journal_records()])
    print(
        f"leader figures: sigterm_handover_seconds={handover:.1f} lease_duration={duration}",
        f"generations_checked={checked.generations_checked}",
    )
