"""Crash safety: SIGKILL the operator at random moments during bursts of membership changes.

After each kill the operator is started again; membership keeps changing while it is down.
Once the bursts stop, every group converges to its current members with each queue owned
exactly once; no generation the watcher saw ever went backwards or repeated; and a restart
over an unchanged membership publishes nothing. Seeded, so a failure can be replayed.
"""

from __future__ import annotations

import functools
import random
import signal
import time
from typing import Any

import pytest

from harness.apps.operator import OperatorProcess
from harness.polling import wait_for
from tests.integration.reliability.reliability_support import (
    Rig,
    owner_count,
    start_churn,
    wait_converged,
)

GROUPS: dict[str, dict[str, Any]] = {
    "sticky-now": {"topics": ["orders", "payments"], "strategy": {"name": "STICKY"}, "debounceSeconds": 0},
    "avg-now": {"topics": ["orders"], "strategy": {"name": "AVG"}, "debounceSeconds": 0},
    "sticky-zones": {
        "topics": ["orders", "payments"],
        "strategy": {"name": "STICKY", "zoneAffinity": True},
        "debounceSeconds": 0.5,
    },
    "avg-later": {"topics": ["payments"], "strategy": {"name": "AVG"}, "debounceSeconds": 0.3},
}


def kill_landed(op: OperatorProcess) -> int:
    """SIGKILL ``op``: 1 when it landed on a running operator (it died of that signal), else 0."""
    proc = op.proc
    if proc is None or proc.poll() is not None:
        return 0  # not running (it would have died on its own: the convergence checks catch that)
    op.kill()
    return 1 if proc.returncode == -signal.SIGKILL else 0


def taken_up(op: OperatorProcess) -> bool:
    """The operator has reconciled every group once (its start-up work): it serves them."""
    return op.reconciles() >= len(GROUPS)


def crash_loop(rig: Rig, cycles: int, seed: int) -> dict[str, int]:
    api, namespace, topics, watcher, start_operator = (
        rig.api, rig.namespace, rig.topics, rig.watcher, rig.start_operator
    )  # fmt: skip
    rng = random.Random(seed)
    churn = start_churn(api, namespace, rig.nodes, rng, GROUPS, pods=2)
    op = start_operator()
    kills = during_startup = early_restarts = 0
    for _ in range(cycles):
        # The operator has taken up every group (one start-up reconcile each): it is at work. A
        # burst of changes follows and the kill lands after a random number of them, at least one
        # (or, one restart in five, again while the restarted operator is still starting).
        wait_for(
            f"the operator to reconcile all {len(GROUPS)} groups",
            functools.partial(taken_up, op),
        )
        burst = rng.randint(2, 8)
        kill_after = rng.randint(1, burst)
        for i in range(burst):
            if i == kill_after:
                time.sleep(rng.uniform(0, 0.4))
                kills += kill_landed(op)
            churn.step()
            time.sleep(rng.uniform(0, 0.15))
        if kill_after == burst:
            time.sleep(rng.uniform(0, 0.4))
            kills += kill_landed(op)
        # Changes while no operator runs.
        for _ in range(rng.randint(0, 2)):
            churn.step()
        early = rng.random() < 0.2
        op = start_operator(wait=not early)
        if early:
            early_restarts += 1
            time.sleep(rng.uniform(0.3, 2.0))
            during_startup += kill_landed(op)
            op = start_operator()

    # Settled: every group reaches its current members, each queue exactly one owner.
    docs = {g: wait_converged(api, namespace, g, churn.members(g)) for g in GROUPS}
    for group, doc in docs.items():
        wanted = [mq for t in GROUPS[group]["topics"] for mq in topics[t]]
        counts = owner_count(doc)
        if churn.members(group):
            assert sorted(counts) == sorted(wanted), f"{group}: queues held {sorted(counts)} != {wanted}"
            assert set(counts.values()) == {1}, f"{group}: a queue with several owners: {counts}"
        else:
            assert not counts, f"{group}: queues held with no members"

    # Every generation of every group checked: the watcher saw each group's generations 1 to the
    # last one (assert_clean fails on any missing between), so at least their sum.
    for g, doc in docs.items():
        watcher.wait_seen(g, doc.generation)
    published = sum(doc.generation for doc in docs.values())
    assert published >= len(GROUPS)

    # An unchanged membership: kill and restart once more; the first reconciles publish nothing.
    before = {g: watcher.generations(g) for g in GROUPS}
    op.kill()
    op = start_operator()
    wait_for(
        "every group reconciled after the restart",
        lambda: op.metric("mqbalance_reconciles_total", result="unchanged") >= len(GROUPS),
    )
    for g in GROUPS:
        wait_converged(api, namespace, g, churn.members(g))
    assert {g: watcher.generations(g) for g in GROUPS} == before
    assert op.metric("mqbalance_reconciles_total", result="published") == 0

    checked = watcher.assert_clean(min_generations=published, journal=op.journal_records())
    op.stop()
    assert during_startup == early_restarts, (
        f"{early_restarts - during_startup} start-up kills found no operator"
    )
    return {
        "kills": kills,
        "kills_during_startup": during_startup,
        "membership_changes": churn.actions,
        "generations_checked": checked.generations_checked,
        "pairs_compared": checked.pairs_compared,
        "documents_read": checked.documents_read,
    }


def _report(figures: dict[str, int]) -> None:
    print("crash-safety figures:", " ".join(f"{k}={v}" for k, v in figures.items()))


def test_operator_survives_sigkill_during_bursts(rig: Rig) -> None:
    figures = crash_loop(rig, 10, 9)
    _report(figures)
    assert figures["kills"] == 10, "a cycle's SIGKILL found no running operator"


@pytest.mark.slow
def test_operator_survives_fifty_sigkills(rig: Rig) -> None:
    figures = crash_loop(rig, 50, 2024)
    _report(figures)
    assert figures["kills"] == 50, "a cycle's SIGKILL found no running operator"
