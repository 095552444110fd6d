"""OffsetReset on the real API server and real brokers: a preview, the approval, the group paused,
the compare-and-set, the write read back (and by RocketMQ's own ``mqadmin consumerProgress``), the
group resumed; a drifted offset aborts naming its queue; bad resets are refused with the reason;
another group's offsets are copied; an operator killed while a reset waits for its pause recovers.

The group's consumption is stood in for by committing offsets with the brokers' own request
(UPDATE_CONSUMER_OFFSET, as a consumer commits): what the reset must compare and overwrite.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from harness import polling
from harness.apps.operator import OperatorProcess
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from harness.rocketmq.server import RocketMQ
from mqbalance.contract import APPROVE_ANNOTATION, GROUP, VERSION
from mqbalance.model import MessageQueue
from mqbalance.rocketmq.admin import BrokerAdmin, QueueRef
from tests.integration.operator_support import (
    apply_group,
    condition,
    custom,
    events_of,
    status_of,
    wait_generation,
)
from tests.integration.rocketmq.rocketmq_support import consumers_namespace, operator_serving, orders_group
from tests.integration.rocketmq.test_lag_offsets import consumer_progress

LABELS = {"app": "reset"}
BROKERS = ("broker-a", "broker-b")
QUEUES = 2  # on each broker


@pytest.fixture(scope="module")
def reset_namespace(cluster: LocalCluster, crds: None, api: client.ApiClient) -> Iterator[tuple[str, str]]:
    with consumers_namespace(api, "reset", 2, LABELS) as namespace_and_node:
        yield namespace_and_node


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    rocketmq: RocketMQ,
    reset_namespace: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    workdir = tmp_path_factory.mktemp("operator-reset")
    with operator_serving(cluster, reset_namespace[0], workdir, "--name-server", rocketmq.namesrv_addr) as op:
        yield op


class Offsets:
    """The brokers' offsets of one topic, read and written as RocketMQ's admin tools do."""

    def __init__(self, rocketmq: RocketMQ, topic: str) -> None:
        self.rocketmq = rocketmq
        self.groups: set[str] = set()
        self.admin = BrokerAdmin(timeout=polling.scaled(5))
        self.refs = {
            MessageQueue(topic, b, q): QueueRef(rocketmq.broker_addr(b), topic, q)
            for b in BROKERS
            for q in range(QUEUES)
        }

    def committed(self, group: str) -> dict[MessageQueue, int | None]:
        async def read() -> dict[MessageQueue, int | None]:
            return {q: await self.admin.committed_offset(group, ref) for q, ref in self.refs.items()}

        return asyncio.run(read())

    def commit(self, group: str, offsets: dict[MessageQueue, int]) -> None:
        """As the group's consumer commits them (the group created first, as its first heartbeat would)."""
        if group not in self.groups:
            self.rocketmq.create_group(group)
            self.groups.add(group)

        async def write() -> None:
            for q, offset in offsets.items():
                await self.admin.commit_offset(group, self.refs[q], offset)

        asyncio.run(write())

    def maxima(self) -> dict[MessageQueue, int]:
        async def read() -> dict[MessageQueue, int]:
            return {q: await self.admin.max_offset(ref) for q, ref in self.refs.items()}

        return asyncio.run(read())

    def at(self, timestamp_ms: int) -> dict[MessageQueue, int]:
        async def read() -> dict[MessageQueue, int]:
            return {q: await self.admin.search_offset(ref, timestamp_ms) for q, ref in self.refs.items()}

        return asyncio.run(read())


def create_reset(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "OffsetReset",
        "metadata": {"name": name},
        "spec": spec,
    }
    custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, "offsetresets", body)


def reset_status(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj = custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "offsetresets", name)
    return dict(cast(dict[str, Any], obj).get("status") or {})


def wait_phase(
    api: client.ApiClient, namespace: str, name: str, *phases: str, timeout: float = 60
) -> dict[str, Any]:
    seen: list[Any] = []

    def probe() -> dict[str, Any] | None:
        status = reset_status(api, namespace, name)
        seen[:] = [status]
        return status if status.get("phase") in phases else None

    return wait_for(f"OffsetReset {name} {'/'.join(phases)}", probe, timeout, details=lambda: repr(seen))


def approve(api: client.ApiClient, namespace: str, name: str) -> None:
    patch = {"metadata": {"annotations": {APPROVE_ANNOTATION: "true"}}}
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, "offsetresets", name, patch)


def by_queue(rows: list[dict[str, Any]], topic: str) -> dict[MessageQueue, dict[str, Any]]:
    return {MessageQueue(topic, r["brokerName"], r["queueId"]): r for r in rows}


def resumed(api: client.ApiClient, namespace: str) -> bool:
    return not status_of(api, namespace, "orders").get("pausedBy")


def test_a_reset_to_a_time_is_previewed_approved_and_lands_exactly(
    cluster: LocalCluster,
    api: client.ApiClient,
    rocketmq: RocketMQ,
    reset_namespace: tuple[str, str],
    operator: OperatorProcess,
    topic_name: str,
) -> None:
    namespace = reset_namespace[0]
    topic = orders_group(api, rocketmq, namespace, topic_name, QUEUES, LABELS)
    group = f"GID_{topic}"
    wait_generation(api, namespace, "orders", 1)
    rocketmq.send(topic, 40)
    middle = int(time.time() * 1000)
    time.sleep(0.05)  # a millisecond clock: the later messages are stored after `middle` for sure
    rocketmq.send(topic, 40)
    offsets = Offsets(rocketmq, topic)
    ends = offsets.maxima()
    offsets.commit(group, ends)  # the group consumed everything
    targets = offsets.at(middle)

    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(middle / 1000)) + f".{middle % 1000:03d}Z"
    create_reset(api, namespace, "rewind", {"group": "orders", "to": {"time": at}})
    status = wait_phase(api, namespace, "rewind", "Proposed")
    rows = by_queue(status["queues"], topic)
    assert {q: r["committed"] for q, r in rows.items()} == ends
    assert {q: r["target"] for q, r in rows.items()} == targets
    assert status["totals"] == {
        "queues": len(ends),
        "skipped": 0,
        "replayed": sum(ends[q] - targets[q] for q in ends),
    }
    assert status["groupName"] == group
    assert condition(status, "Approved")["reason"] == "WaitingForApproval"
    table = cluster.kubectl("get", "offsetresets", "-n", namespace).stdout.splitlines()
    assert table[0].split()[:6] == ["NAME", "GROUP", "PHASE", "QUEUES", "SKIPPED", "REPLAYED"]
    assert table[1].split()[:3] == ["rewind", "orders", "Proposed"]
    assert resumed(api, namespace)  # nothing is paused before the approval
    assert offsets.committed(group) == ends

    approve(api, namespace, "rewind")
    status = wait_phase(api, namespace, "rewind", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status
    assert offsets.committed(group) == targets
    # RocketMQ's own tool reads the same committed offsets (4.x's consumerProgress first looks up the
    # group's retry topic, which only a real consumer's heartbeat creates: checked on 5.x).
    if rocketmq.is_5x:
        progress = consumer_progress(rocketmq, group, topic)
        assert {q: consumer for q, (_, consumer, _) in progress.items() if q in targets} == {
            q: t for q, t in targets.items() if q in progress
        }
    wait_for("the group to resume", lambda: resumed(api, namespace))
    history = status_of(api, namespace, "orders").get("history") or []
    assert [h["reason"] for h in history][:2] == ["resumed", "paused"]
    reasons = [e.reason for e in events_of(api, namespace, "rewind")]
    assert {"Previewed", "Approved", "Succeeded"} <= set(reasons)


def test_a_drifted_offset_aborts_naming_its_queue_and_the_group_resumes(
    api: client.ApiClient,
    rocketmq: RocketMQ,
    reset_namespace: tuple[str, str],
    operator: OperatorProcess,
    topic_name: str,
) -> None:
    namespace = reset_namespace[0]
    topic = orders_group(api, rocketmq, namespace, topic_name, QUEUES, LABELS)
    group = f"GID_{topic}"
    rocketmq.send(topic, 40)
    offsets = Offsets(rocketmq, topic)
    ends = offsets.maxima()
    offsets.commit(group, ends)
    create_reset(api, namespace, "skip", {"group": "orders", "to": {"position": "Earliest"}})
    wait_phase(api, namespace, "skip", "Proposed")
    # Someone else (a tool, a consumer outside mqbalance) moves one queue back after the preview.
    drifted = MessageQueue(topic, "broker-b", 1)
    assert ends[drifted] > 0
    offsets.commit(group, {drifted: ends[drifted] - 1})
    approve(api, namespace, "skip")
    status = wait_phase(api, namespace, "skip", "Succeeded", "Failed")
    failure = condition(status, "Succeeded")
    assert (status["phase"], failure["reason"]) == ("Failed", "OffsetsDrifted"), status
    assert f"orders/broker-b/1 ({ends[drifted]} -> {ends[drifted] - 1})" in failure["message"]
    assert offsets.committed(group) == {**ends, drifted: ends[drifted] - 1}  # nothing written
    wait_for("the group to resume", lambda: resumed(api, namespace))
    assert events_of(api, namespace, "skip", "OffsetsDrifted")


def test_bad_resets_are_refused_with_what_to_fix(
    cluster: LocalCluster,
    api: client.ApiClient,
    rocketmq: RocketMQ,
    reset_namespace: tuple[str, str],
    operator: OperatorProcess,
    topic_name: str,
) -> None:
    namespace = reset_namespace[0]
    topic = orders_group(api, rocketmq, namespace, topic_name, QUEUES, LABELS)
    rocketmq.send(topic, 8)
    ends = Offsets(rocketmq, topic).maxima()
    apply_group(
        api, namespace, "everyone", {"topics": ["orders"], "selector": {}, "messageModel": "BROADCASTING"}
    )
    beyond = {"topic": "orders", "brokerName": "broker-a", "queueId": 0, "offset": 10**6}
    end = ends[MessageQueue(topic, "broker-a", 0)]
    latest = {"position": "Latest"}
    cases = {
        "nobody": ({"group": "nosuchgroup", "to": latest}, "GroupNotFound", "no ConsumerGroup"),
        "stray": (
            {"group": "orders", "topics": ["payments"], "to": latest},
            "TopicNotSubscribed",
            "does not subscribe payments",
        ),
        "broadcast": ({"group": "everyone", "to": latest}, "Broadcasting", "BROADCASTING"),
        "far": (
            {"group": "orders", "to": {"offsets": [beyond]}},
            "TargetOutOfRange",
            f"orders/broker-a/0 (1000000 not in [0, {end}])",
        ),
    }
    for name, (spec, _, _) in cases.items():
        create_reset(api, namespace, name, spec)

    def check(name: str, reason: str, words: str) -> None:
        status = wait_phase(api, namespace, name, "Failed", "Proposed")
        failure = condition(status, "Succeeded")
        assert (status["phase"], failure["reason"]) == ("Failed", reason), (name, status)
        assert words in failure["message"], (name, failure)

    for name, (_, reason, words) in cases.items():
        check(name, reason, words)
    # A second reset of a group while one is under way (one not worked on yet counts as under way).
    create_reset(api, namespace, "first", {"group": "orders", "to": {"position": "Latest"}})
    wait_phase(api, namespace, "first", "Proposed")
    create_reset(api, namespace, "second", {"group": "orders", "to": {"position": "Earliest"}})
    check("second", "ResetInProgress", "OffsetReset first of group orders is under way")
    # Two targets at once: the schema refuses it; an API server older than 1.28 drops the schema's
    # CEL rules, and the operator refuses the same with InvalidSpec.
    both = {"group": "orders", "to": {"position": "Latest", "fromGroup": "x"}}
    if cluster.legacy:
        create_reset(api, namespace, "both", both)
        check(
            "both", "InvalidSpec", "set exactly one of spec.to.time, to.position, to.offsets or to.fromGroup"
        )
    else:
        with pytest.raises(client.ApiException) as refused:
            create_reset(api, namespace, "both", both)
        assert "set exactly one of to.time, to.position, to.offsets or to.fromGroup" in str(
            refused.value.body
        )
    custom(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, "offsetresets", "first")


def test_another_groups_offsets_are_copied(
    api: client.ApiClient,
    rocketmq: RocketMQ,
    reset_namespace: tuple[str, str],
    operator: OperatorProcess,
    topic_name: str,
) -> None:
    namespace = reset_namespace[0]
    topic = orders_group(api, rocketmq, namespace, topic_name, QUEUES, LABELS)
    apply_group(
        api, namespace, "billing", {"groupName": f"GID_{topic}_billing", "topics": ["orders"], "selector": {}}
    )
    rocketmq.send(topic, 40)
    offsets = Offsets(rocketmq, topic)
    ends = offsets.maxima()
    source = {
        q: max(0, end - i) for i, (q, end) in enumerate(sorted(ends.items(), key=lambda kv: str(kv[0])))
    }
    offsets.commit(f"GID_{topic}_billing", source)
    offsets.commit(f"GID_{topic}", ends)
    create_reset(api, namespace, "copy", {"group": "orders", "to": {"fromGroup": "billing"}})
    wait_phase(api, namespace, "copy", "Proposed")
    approve(api, namespace, "copy")
    status = wait_phase(api, namespace, "copy", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status
    assert offsets.committed(f"GID_{topic}") == source
    assert offsets.committed(f"GID_{topic}_billing") == source


def test_an_operator_killed_during_a_reset_goes_on_after_its_restart(
    api: client.ApiClient,
    rocketmq: RocketMQ,
    reset_namespace: tuple[str, str],
    operator: OperatorProcess,
    topic_name: str,
) -> None:
    namespace = reset_namespace[0]
    topic = orders_group(api, rocketmq, namespace, topic_name, QUEUES, LABELS)
    group = f"GID_{topic}"
    rocketmq.send(topic, 40)
    offsets = Offsets(rocketmq, topic)
    ends = offsets.maxima()
    offsets.commit(group, ends)
    create_reset(api, namespace, "again", {"group": "orders", "to": {"position": "Earliest"}})
    wait_phase(api, namespace, "again", "Proposed")
    # Killed (SIGKILL) as soon as the approval is taken up, in whichever phase it is then; the
    # phase is in the status, so the next operator goes on from it.
    approve(api, namespace, "again")
    killed_in = wait_phase(api, namespace, "again", "Pausing", "Verifying", "Writing", "Succeeded")["phase"]
    operator.kill()
    print(f"operator killed with the reset in phase {killed_in}")
    operator.start()
    status = wait_phase(api, namespace, "again", "Succeeded", "Failed", timeout=120)
    assert status["phase"] == "Succeeded", status
    assert offsets.committed(group) == dict.fromkeys(ends, 0)
    wait_for("the group to resume", lambda: resumed(api, namespace))


def kubectl_mqbalance(
    cluster: LocalCluster, *args: str, answer: str = ""
) -> subprocess.CompletedProcess[str]:
    """``kubectl mqbalance ARGS`` as a user runs it (the plugin found on the PATH), ``answer`` typed in."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    return subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "mqbalance", *args],
        env=env,
        input=answer,
        capture_output=True,
        text=True,
        timeout=polling.scaled(120),
        check=False,
    )


def test_kubectl_mqbalance_reset_previews_asks_and_follows_the_reset(
    cluster: LocalCluster,
    api: client.ApiClient,
    rocketmq: RocketMQ,
    reset_namespace: tuple[str, str],
    operator: OperatorProcess,
    topic_name: str,
) -> None:
    namespace = reset_namespace[0]
    topic = orders_group(api, rocketmq, namespace, topic_name, QUEUES, LABELS)
    group = f"GID_{topic}"
    rocketmq.send(topic, 40)
    offsets = Offsets(rocketmq, topic)
    ends = offsets.maxima()
    offsets.commit(group, dict.fromkeys(ends, 0))

    declined = kubectl_mqbalance(
        cluster, "reset", "orders", "-n", namespace, "--to-latest", "--name", "no", answer="n\n"
    )
    assert declined.returncode == 1, declined.stderr
    assert (
        f"OffsetReset no (RocketMQ group {group}): {len(ends)} queues, {sum(ends.values())} messages skipped"
        in declined.stdout
    )
    assert "OffsetReset no: not applied, deleted" in declined.stdout
    assert offsets.committed(group) == dict.fromkeys(ends, 0)

    done = kubectl_mqbalance(cluster, "reset", "orders", "-n", namespace, "--to-latest", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Succeeded" in done.stdout
    assert f"{len(ends)} queues were reset: {sum(ends.values())} messages skipped" in done.stdout
    assert offsets.committed(group) == ends
    missing = kubectl_mqbalance(cluster, "reset", "nosuchgroup", "-n", namespace, "--to-latest", "--yes")
    assert missing.returncode == 1
    assert "not found (kubectl get consumergroups -A lists them)" in missing.stderr
    wait_for("the group to resume", lambda: resumed(api, namespace))
