"""Real messages through the ways of balancing, while members join, leave and are SIGKILLed.

The short form of bench/bench_e2e_messages.py. Nothing the broker stored may be lost, by
RocketMQ's own rebalance or by mqbalance's operator + sidecars + SidecarPushConsumer; and with
the handover on, queues that move between live members (joins, clean leaves) are consumed
exactly once, and in order with orderly consumers.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.e2e import (
    NAMESPACE,
    MqbalanceOrderlyLeaseVariant,
    MqbalanceUnnoticedCrashVariant,
    Step,
    World,
    consumed_records,
    failover_waits,
    run,
    world,
)
from harness.rocketmq.releases import version_under_test
from tests.integration.invariants import consumer_problems


@pytest.fixture(scope="module")
def e2e_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The tested release's servers and client (harness.rocketmq.releases.version_under_test: the current line
    unless MQBALANCE_ROCKETMQ_VERSION names another)."""
    with world(tmp_path_factory.mktemp("e2e"), version_under_test()) as w:
        yield w


def test_no_message_is_lost_by_either_variant(e2e_world: World) -> None:
    script = (Step(0.25, "join", 3), Step(0.5, "kill", 1))
    scores = run(e2e_world, ["rocketmq", "mqbalance"], seconds=20, rate=50, keys=16, script=script)
    produced = scores[0].produced
    assert produced > 500, f"the producer sent only {produced} messages"
    for score in scores:
        assert score.lost == 0, f"{score.variant} lost {score.lost} of {produced} messages"
        assert score.consumed >= produced
        # Every queue consumed, and (mqbalance) by exactly the owners its assignment named.
        problems = consumer_problems(score)
        assert not problems, "\n".join(problems)
    logs = list(Path(e2e_world.workdir).glob("*.tsv"))
    assert any("e2e-mqbalance" in p.name for p in logs)


def test_with_the_handover_moves_between_live_members_consume_each_message_once(e2e_world: World) -> None:
    script = (Step(0.2, "join", 3), Step(0.45, "leave", 0), Step(0.7, "join", 4))
    variants = ["mqbalance", "mqbalance-handover", "mqbalance-orderly"]
    scores = {
        s.variant: s
        for s in run(e2e_world, variants, seconds=30, rate=50, keys=16, script=script, tag="live")
    }
    produced = scores["mqbalance"].produced
    assert produced > 1000, f"the producer sent only {produced} messages"
    for score in scores.values():
        assert score.lost == 0, f"{score.variant} lost {score.lost} of {produced} messages"
        problems = consumer_problems(score)
        assert not problems, "\n".join(problems)
        # The script moved queues between live members, and their new owners consumed them.
        assert score.moves is not None
        assert score.moves.moves > 0, score
    for variant in ("mqbalance-handover", "mqbalance-orderly"):
        assert scores[variant].duplicates == 0, f"{variant}: {scores[variant].duplicates} duplicates"
        moves = scores[variant].moves
        assert moves is not None
        # A queue leaves a member that stays only once that member released it.
        assert moves.staying > 0, f"{variant}: no queue moved away from a member that stayed: {moves}"
        assert moves.staying_waited_min_s > 0, f"{variant}: a queue moved without its release: {moves}"
    assert scores["mqbalance-orderly"].order_violations == 0
    # Every revoked queue was released by its owner, none given away at the timeout.
    for variant in ("mqbalance-handover", "mqbalance-orderly"):
        assert_nothing_overridden(e2e_world, f"e2e-live-{variant}")
    operator = e2e_world.operator
    assert operator is not None
    assert operator.metric("mqbalance_handover_assigned_queues_total", outcome="released") > 0


def test_a_paused_and_resumed_group_loses_and_repeats_nothing(e2e_world: World) -> None:
    """spec.paused with handover Release, while the producer sends: every member commits and releases
    its queues, nothing is consumed while paused, and after the resume every message is consumed
    once (SidecarPushConsumer, RocketMQ's own Java client)."""
    script = (Step(0.3, "pause", 0), Step(0.65, "resume", 0))
    [score] = run(e2e_world, ["mqbalance-handover"], seconds=30, rate=50, keys=16, script=script, tag="pause")
    assert score.produced > 1000, f"the producer sent only {score.produced} messages"
    assert score.lost == 0, f"lost {score.lost} of {score.produced} messages"
    assert score.duplicates == 0, f"{score.duplicates} duplicates"
    assert not consumer_problems(score), "\n".join(consumer_problems(score))
    # Nothing was consumed while paused: every queue the producer wrote to waited out the pause.
    assert len(score.idle_queues(5.0)) == len(score.produced_queues), sorted(score.queue_gaps.items())
    assert_nothing_overridden(e2e_world, "e2e-pause-mqbalance-handover")


def test_an_orderly_member_that_dies_is_replaced_in_seconds_not_at_its_broker_locks_expiry(
    e2e_world: World,
) -> None:
    """An orderly member SIGKILLed, its pod then gone (a lost node, say): once its grant has surely
    expired the operator hands its queues on and, first, releases the dead client's broker locks
    (its Lease named the client), so the new owners lock and consume them at once: within
    leaseSeconds + leaseMarginSeconds and a little of the kill, not when the locks would have
    expired, 40 to 60 s after it (RocketMQ's own clients, handover Orderly)."""
    operator = e2e_world.operator
    assert operator is not None
    script = (Step(0.25, "consuming", 1), Step(0.3, "kill", 1))
    [score] = run(
        e2e_world, ["mqbalance-orderly-lease"], seconds=40, rate=50, keys=16, script=script, tag="failover"
    )
    assert score.lost == 0, f"lost {score.lost} of {score.produced} messages"
    assert score.order_violations == 0
    assert not consumer_problems(score), "\n".join(consumer_problems(score))
    group = "e2e-failover-mqbalance-orderly-lease"
    dead = f"{group}-1"
    waits = failover_waits(e2e_world.workdir, group, dead, score.killed_at[dead])
    assert waits, "the member consumed nothing before it was killed"
    lease = MqbalanceOrderlyLeaseVariant.lease
    bound = lease["leaseSeconds"] + lease["leaseMarginSeconds"]
    print(f"orderly failover, s from the kill to the next consumption: {waits}; lease + margin {bound:g}")
    # Released, not expired: the dead client renewed its locks at most 20 s before the kill, so
    # they would have held its queues 40 s past it at least.
    assert max(waits.values()) < 30, waits
    assert operator.metric("mqbalance_broker_unlocked_queues_total", result="released") >= len(waits)
    assert_nothing_overridden(e2e_world, group)


def test_a_consumer_that_crashes_is_replaced_as_its_sidecar_sees_it_go_and_then_counted_in_again(
    e2e_world: World,
) -> None:
    """A consumer JVM SIGKILLed in a pod that stays Ready (its kubelet has not noticed) and started
    again 5 s later: its connections to the sidecar close, the sidecar withholds its queues and tells
    the operator, which gives them on at once. Without that nothing would move them: the pod is Ready
    and its Lease renewed, so they would wait for the restarted JVM. Once it runs again it is given
    queues again (handover Release, RocketMQ's own Java client)."""
    script = (Step(0.25, "consuming", 1), Step(0.3, "crash", 1), Step(0.35, "consuming", 1))
    variant = MqbalanceUnnoticedCrashVariant
    [score] = run(e2e_world, [variant.name], seconds=30, rate=50, keys=16, script=script, tag="crash")
    assert score.lost == 0, f"lost {score.lost} of {score.produced} messages"
    assert score.duplicates == score.duplicates_after_kill, "only what the killed JVM had not committed"
    assert not consumer_problems(score), "\n".join(consumer_problems(score))
    group = f"e2e-crash-{variant.name}"
    crashed = f"{group}-1"
    killed_at = score.killed_at[crashed]
    waits = failover_waits(e2e_world.workdir, group, crashed, killed_at)
    print(f"crash, s from the SIGKILL to the next consumption elsewhere: {waits}")
    assert waits, "the member consumed nothing before it crashed"
    restarted_ms = (killed_at + variant.crash_restart_seconds) * 1000
    again = [
        r[0] for r in consumed_records(e2e_world.workdir, group) if r[6] == crashed and r[0] > restarted_ms
    ]
    assert again, "the restarted consumer was not given queues again"
    # Consumed elsewhere before the restarted JVM consumed anything: the crash moved them, not the restart.
    assert all(killed_at + w < min(again) / 1000 for w in waits.values()), (
        waits,
        min(again) / 1000 - killed_at,
    )
    assert_nothing_overridden(e2e_world, group)
    # Out once, in once: an absence the operator took for stale would count it in and out again and again.
    status = e2e_world.group_status(group)
    flapping = {c["type"]: c for c in status.get("conditions") or []}.get("Flapping") or {}
    assert flapping.get("status") != "True", (flapping, status.get("history"))


def test_an_orderly_member_only_frozen_keeps_its_queues_and_its_locks(e2e_world: World) -> None:
    """SIGSTOP instead of SIGKILL, for longer than leaseSeconds + leaseMarginSeconds: the JVM stalls
    but its pod and sidecar live on and renew its Lease, so mqbalance never takes it for stopped:
    no lock is released, nobody else consumes its queues meanwhile, and after SIGCONT it carries
    on where it stopped: nothing lost, nothing consumed twice, order kept (never two owners)."""
    operator = e2e_world.operator
    assert operator is not None
    released = operator.metric("mqbalance_broker_unlocked_queues_total", result="released")
    script = (Step(0.25, "consuming", 1), Step(0.3, "freeze", 1), Step(0.65, "thaw", 1))
    [score] = run(
        e2e_world, ["mqbalance-orderly-lease"], seconds=40, rate=50, keys=16, script=script, tag="frozen"
    )
    assert score.lost == 0, f"lost {score.lost} of {score.produced} messages"
    assert score.duplicates == 0, f"{score.duplicates} duplicates: a frozen member's queues were taken"
    assert score.order_violations == 0
    assert not consumer_problems(score), "\n".join(consumer_problems(score))
    assert operator.metric("mqbalance_broker_unlocked_queues_total", result="released") == released
    # Its queues waited for it: idle while it was frozen (14 s), consumed by it alone.
    frozen = "e2e-frozen-mqbalance-orderly-lease-1"
    mine = sorted(q for q, members in score.consumers.items() if frozen in members)
    assert mine, "the frozen member consumed nothing"
    assert all(score.consumers[q] == frozenset({frozen}) for q in mine), score.consumers
    assert all(score.queue_gaps[q] > 10 for q in mine), score.queue_gaps
    assert_nothing_overridden(e2e_world, "e2e-frozen-mqbalance-orderly-lease")


def assert_nothing_overridden(w: World, group: str) -> None:
    """No queue of ``group`` was given on without its owner's release (the group's own count: the
    operator's metric sums every group the world's tests made)."""
    status = w.group_status(group)
    overridden = (status.get("handover") or {}).get("overriddenQueues", 0)
    assert overridden == 0, f"{group}: {overridden} queues overridden; history {status.get('history')}"


def test_a_reset_to_a_time_while_consumers_run_replays_exactly_the_messages_after_it(
    e2e_world: World,
) -> None:
    """An OffsetReset to a time 9 s back, approved as it is created, while the producer sends and three
    SidecarPushConsumers (handover Release) consume: the group pauses, the offsets are written and the
    group resumes; every message stored after the time and consumed before the reset is consumed once
    more, those before it are not, and nothing is lost (RocketMQ's own Java client)."""
    script = (Step(0.3, "mark", 0), Step(0.6, "reset", 0))
    [score] = run(e2e_world, ["mqbalance-handover"], seconds=30, rate=50, keys=16, script=script, tag="reset")
    reset = json.loads(
        e2e_world.cluster.kubectl(
            "get", "offsetreset", "e2e-reset-mqbalance-handover-rewind", "-n", NAMESPACE, "-o", "json"
        ).stdout
    )["status"]
    assert reset["phase"] == "Succeeded", reset
    assert score.produced > 1000, f"the producer sent only {score.produced} messages"
    assert score.lost == 0, f"lost {score.lost} of {score.produced} messages"
    # Per queue: the offsets from the target to the offset committed when the group paused were
    # consumed twice, every other offset once; the duplicates are exactly those the preview counted.
    records = consumed_records(e2e_world.workdir, "e2e-reset-mqbalance-handover")
    times: dict[tuple[str, int, int], int] = defaultdict(int)
    for _, broker, queue, offset, *_ in records:
        times[(broker, queue, offset)] += 1
    wrong = []
    for row in reset["queues"]:
        target, committed = row["target"], row.get("committed", row["target"])
        for (broker, queue, offset), n in times.items():
            if (broker, queue) == (row["brokerName"], row["queueId"]):
                expected = 2 if target <= offset < committed else 1
                if n != expected:
                    wrong.append(f"{broker}:{queue}:{offset} consumed {n} times, not {expected}")
    assert wrong == [], f"{len(wrong)} offsets: {wrong[:20]}; reset {reset['queues']}"
    assert reset["totals"]["replayed"] > 0, reset["totals"]
    assert score.duplicates == reset["totals"]["replayed"], (score.duplicates, reset["totals"])
    assert_nothing_overridden(e2e_world, "e2e-reset-mqbalance-handover")
    print(f"reset: {reset['totals']}, produced {score.produced}, duplicates {score.duplicates}")


def test_a_group_of_java_and_go_consumers_moves_queues_once_through_the_sidecars(e2e_world: World) -> None:
    """One group whose members are Java (clients/java) and Go (clients/go) push consumers at once,
    through joins and a clean leave: with the handover, every queue is consumed by the owners the
    operator named, none lost, none twice. Beside it the same mixed group under the clients' own
    rebalance, whose duplicates and idle queues are counted (printed; docs/benchmarks.md)."""
    script = (Step(0.2, "join", 3), Step(0.45, "leave", 0), Step(0.7, "join", 4))
    variants = ["mixed-rocketmq", "mixed-handover"]
    scores = {
        s.variant: s
        for s in run(e2e_world, variants, seconds=30, rate=50, keys=16, script=script, tag="mixed")
    }
    for score in scores.values():
        print(
            f"{score.variant}: produced {score.produced}, lost {score.lost}, duplicates {score.duplicates}, "
            f"queues idle over 5 s {score.idle_queues(5.0)}, longest gap {score.longest_gap_s:.1f} s "
            f"({score.gap_queue}), moves {score.moves}"
        )
    mixed = scores["mixed-handover"]
    assert mixed.produced > 1000, f"the producer sent only {mixed.produced} messages"
    for score in scores.values():
        assert score.lost == 0, f"{score.variant} lost {score.lost} of {score.produced} messages"
    assert not consumer_problems(mixed), "\n".join(consumer_problems(mixed))
    assert mixed.duplicates == 0, f"mixed-handover: {mixed.duplicates} duplicates"
    # Both languages consumed, and queues moved away from members that stayed only once released.
    members = {m for ms in mixed.consumers.values() for m in ms}
    assert {m for m in members if m.endswith(("-1", "-3"))}, f"no Go member consumed: {members}"
    assert {m for m in members if m.endswith(("-0", "-2", "-4"))}, f"no Java member consumed: {members}"
    assert mixed.moves is not None
    assert mixed.moves.staying > 0, f"no queue moved away from a member that stayed: {mixed.moves}"
    assert mixed.moves.staying_waited_min_s > 0, f"a queue moved without its release: {mixed.moves}"
