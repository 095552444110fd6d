"""Bad input: every object of the corpus is rejected at admission or reported in status, while
the operator keeps serving a healthy group in the same namespace."""

from __future__ import annotations

import contextlib
import functools
import random
import re
from collections import Counter
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.kube import kubelet
from harness.kube.cluster import LocalCluster
from harness.polling import wait_for, work_timeout
from tests.integration.operator_support import (
    GROUP,
    VERSION,
    condition,
    custom,
    get_group,
)
from tests.integration.reliability.corpus import PROBE_LABELS, Case, corpus
from tests.integration.reliability.reliability_support import (
    Caused,
    Rig,
    start_churn,
    wait_converged,
)

CONTROL = "control"

# A case's fate is awaited for FATE_BASE seconds plus PER_QUEUE for every queue of the Topics whose
# fate is still awaited: the operator reconciles the probe groups in no particular order, so the wait
# for one case may include the work on any case still pending, and a group subscribing a Topic at the
# bound of 4,096 queues costs a fraction of a second of operator CPU per reconcile (a Topic over a bound
# is refused from its counts, before its queues are built). wait_for scales the sum for the machine's load.
FATE_BASE = 60.0
PER_QUEUE = 0.0005
SETTLE_BASE = 10.0


def create(api: client.ApiClient, namespace: str, kind: str, name: str, spec: Any) -> ApiException | None:
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}}
    if spec is not None:
        body["spec"] = spec
    plural = "topics" if kind == "Topic" else "consumergroups"
    try:
        custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    except ApiException as e:
        return e
    return None


def fate_of(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """The group's reported fate once its status describes its current spec, else None."""
    obj = get_group(api, namespace, name) or {}
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj.get("metadata", {}).get("generation"):
        return None
    invalid, ready = condition(status, "Invalid"), condition(status, "Ready")
    if invalid.get("status") == "True":
        assert invalid.get("message"), f"{name}: Invalid without a message: {invalid}"
        return f"invalid:{invalid['reason']}"
    if ready.get("status") == "True":
        return "served"
    if ready.get("status") == "False":
        return f"not-ready:{ready['reason']}"
    return None


def settles_on(api: client.ApiClient, namespace: str, name: str, fate: str) -> bool:
    return fate_of(api, namespace, name) == fate


def queue_count(case: Case) -> int:
    """The queues a Topic case declares (0 for a group, or a spec without countable brokers)."""
    brokers = case.spec.get("brokers") if case.kind == "Topic" and isinstance(case.spec, dict) else None
    if not isinstance(brokers, list):
        return 0
    return sum(
        b["readQueueNums"] for b in brokers if isinstance(b, dict) and isinstance(b.get("readQueueNums"), int)
    )


def names_field(message: str, where: str) -> bool:
    """The 422 message names the field (list indices ignored)."""
    plain = re.sub(r"\[\d+\]", "", message)
    return re.sub(r"\[\d+\]", "", where) in plain


def test_bad_input_corpus(
    cluster: LocalCluster,
    rig: Rig,
) -> None:
    api_client, namespace, nodes = rig.api, rig.namespace, rig.nodes
    caused = Caused()
    cases = corpus(legacy=cluster.legacy)
    assert len(cases) >= 100
    # The healthy group, and one member that every probe group selects.
    control = {"topics": ["orders", "payments"], "debounceSeconds": 0}
    churn = start_churn(api_client, namespace, nodes, random.Random(3), {CONTROL: control}, pods=2)
    kubelet.create_pod(api_client, namespace, "probe-0", PROBE_LABELS)
    kubelet.bind_pod(api_client, namespace, "probe-0", nodes[0])
    kubelet.set_pod_ready(api_client, namespace, "probe-0")
    op = rig.start_operator()
    wait_converged(api_client, namespace, CONTROL, churn.members(CONTROL), caused=caused)

    wrong: list[str] = []
    watched: dict[str, Case] = {}  # group name -> case whose fate it reports
    outcomes: Counter[str] = Counter()
    for i, case in enumerate(cases):
        name = case.resource_name or f"{'bt' if case.kind == 'Topic' else 'bg'}-{i}"
        error = create(api_client, namespace, case.kind, name, case.spec)
        if error is not None:
            message = str(error.body)
            if case.fate != "rejected":
                wrong.append(
                    f"#{i} {case.kind} {case.name}: expected {case.fate}, got {error.status} {message[:300]}"
                )
            elif error.status != 422 or not names_field(message, case.where):
                wrong.append(
                    f"#{i} {case.kind} {case.name}: 422 naming {case.where} expected, "
                    f"got {error.status} {message[:300]}"
                )
            elif case.message not in message:
                wrong.append(
                    f"#{i} {case.kind} {case.name}: 422 saying {case.message!r} expected, got {message}"
                )
            outcomes["rejected"] += 1
            continue
        if case.fate == "rejected":
            wrong.append(f"#{i} {case.kind} {case.name}: accepted, expected a 422 naming {case.where}")
            continue
        if case.kind == "Topic":
            probe = f"{name}-probe"
            spec = {
                "topics": ["orders", name],
                "selector": {"matchLabels": PROBE_LABELS},
                "debounceSeconds": 0,
            }
            assert create(api_client, namespace, "ConsumerGroup", probe, spec) is None
            watched[probe] = case
        else:
            watched[name] = case

    pending_queues = sum(queue_count(case) for case in watched.values())
    for name, case in watched.items():
        fate = wait_for(
            f"{name} ({case.name}) to report its fate",
            functools.partial(fate_of, api_client, namespace, name),
            timeout=work_timeout(FATE_BASE, PER_QUEUE, pending_queues),
        )
        pending_queues -= queue_count(case)
        if fate != case.fate:
            # The Topic and the group arrive through separate watches: a probe created right after
            # its Topic may be reconciled once before the Topic is seen. The fate that counts is the
            # one it settles on.
            settled = functools.partial(settles_on, api_client, namespace, name, case.fate)
            with contextlib.suppress(AssertionError):
                wait_for(
                    f"{name} ({case.name}) to settle",
                    settled,
                    timeout=work_timeout(SETTLE_BASE, PER_QUEUE, queue_count(case)),
                )
            fate = fate_of(api_client, namespace, name) or fate
        outcomes[fate.split(":")[0]] += 1
        if fate != case.fate:
            wrong.append(f"{case.kind} {case.name}: expected {case.fate}, got {fate}")

    # The healthy group still follows its members.
    churn.add(CONTROL)
    wait_converged(api_client, namespace, CONTROL, churn.members(CONTROL), caused=caused)
    gone = sorted(churn.pods[CONTROL])[0]
    kubelet.delete_pod(api_client, namespace, gone)
    del churn.pods[CONTROL][gone]
    wait_converged(api_client, namespace, CONTROL, churn.members(CONTROL), caused=caused)
    assert op.alive, op.tail()
    # At least the healthy group's three generations (two members, three, two again), every
    # generation of every group checked.
    caused.check(rig.watcher, op.journal_records())
    print(
        f"bad-input figures on {cluster.version}: cases={len(cases)} "
        + " ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))
    )
    assert not wrong, f"{len(wrong)} of {len(cases)} cases went otherwise:\n" + "\n".join(wrong)
