"""The demo on real pods: `make demo` when a real node can run here (see harness.demo).

Starts three real nodes in zones a, b and c (harness.node.cluster.RealNode with ``nodes=3``; one node
where the Kubernetes release is older than 1.29), installs the Helm chart with the locally built
image, applies examples/topic.yaml, examples/consumergroup.yaml and the example consumer
Deployment (an app container beside the mqbalance sidecar in every pod, spread over the zones),
scales it 3 -> 5 -> 4, and prints each assignment, the zone of every member, the queues that
moved, what every pod's own sidecar serves (asked inside the pod with kubectl exec) and
`kubectl get consumergroups`. Everything is torn down at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from harness import polling
from harness.demo import report as demo_report
from harness.demo.common import DemoError, print_sidecar, show_change, step
from harness.kube.versions import resolve_version
from harness.node.cluster import RealNode
from harness.node.images import ensure_images
from harness.node.requirements import unavailable
from harness.node.specs import MAX_NODES
from harness.node.workload import (
    GROUP,
    NAMESPACE,
    apply_example_consumers,
    install_chart,
    rollout_status,
    save_journal,
    sidecar_view,
    wait_members,
    zones_of_pods,
)
from mqbalance.contract import AssignmentDocument

DEBOUNCE = 3.0


def _scale(node: RealNode, replicas: int, timeout: float) -> AssignmentDocument:
    node.kubectl("scale", "-n", NAMESPACE, f"deploy/{GROUP}", f"--replicas={replicas}")
    rollout_status(node, GROUP, timeout=timeout)
    try:
        return wait_members(node, replicas, timeout)
    except AssertionError as exc:
        raise DemoError(str(exc)) from None


def _note_generations(before: AssignmentDocument, after: AssignmentDocument) -> None:
    steps = after.generation - before.generation
    if steps > 1:
        print(
            f"(published in {steps} generations: the pods turned Ready more than {DEBOUNCE:g} s apart; "
            "the moves below add them up)"
        )


def _show_sidecars(node: RealNode, doc: AssignmentDocument) -> None:
    for pod in sorted(doc.members):

        def current(pod: str = pod) -> dict[str, Any] | None:
            view = sidecar_view(node, pod)
            return view if int(view["generation"]) >= doc.generation else None

        view = polling.wait_for(
            f"{pod}'s sidecar to serve generation {doc.generation}", current, 30, 0.3, DemoError
        )
        view.setdefault("member", pod)
        view.setdefault("queueCount", sum(len(qs) for qs in view["queues"].values()))
        print_sidecar(view)


def _show_zones(node: RealNode, doc: AssignmentDocument) -> None:
    zones = zones_of_pods(node, set(doc.members))
    by_zone: dict[str, list[str]] = {}
    for pod in sorted(doc.members):
        by_zone.setdefault(zones.get(pod, "?"), []).append(pod)
    print("Members by zone: " + "; ".join(f"{z}: {', '.join(ps)}" for z, ps in sorted(by_zone.items())))


def _keep_journal(node: RealNode, path: Path) -> None:
    try:
        records = save_journal(node, path)
    except (AssertionError, subprocess.SubprocessError) as exc:  # no operator pod (yet)
        print(f"the operator's journal could not be kept: {exc}")
        return
    step(
        f"the operator's journal ({records} records) kept in {path}; replay it with "
        f"`mqbalance replay --journal {path} --out DIR`"
    )


def run(workdir: Path | None, timeout: float, keep_journal: Path | None = None) -> int:
    """The real-pod demo; returns the exit status. ``keep_journal``: a directory where the
    operator's log (its rebalance journal) is kept before the teardown, also after a failure."""
    started = time.monotonic()
    step("building or reusing the node binaries and images (cached; see docs/real-node.md)")
    images = ensure_images()
    nodes = MAX_NODES if unavailable(resolve_version(), need_built=False, nodes=MAX_NODES) is None else 1
    what = "a real node" if nodes == 1 else f"{nodes} real nodes in zones a to {'abc'[nodes - 1]}"
    step(f"starting {what}: kubelet + containerd + kube-proxy each, image {images.mqbalance}")
    node = RealNode(workdir / "node" if workdir else None, images=images, nodes=nodes)
    try:
        node.start()
        milestones = ", ".join(f"{k} {v:.1f} s" for k, v in node.timings.items())
        names = ", ".join(f"{s.name} ({s.zone})" for s in node.specs)
        step(f"nodes {names} Ready, API server at {node.server} ({milestones})")
        step("helm install mqbalance charts/mqbalance (local image, imagePullPolicy Never)")
        node.kubectl("create", "namespace", NAMESPACE)
        install_chart(node, images)
        step(
            "applying examples/topic.yaml, examples/consumergroup.yaml and the consumer Deployment "
            f"in namespace {NAMESPACE}"
        )
        # A short window, so pods turning Ready one after another are usually one rebalance.
        apply_example_consumers(node, images, 3, debounce=DEBOUNCE, spread_zones=nodes > 1)
        first = _scale(node, 3, timeout)
        print()
        print("Assignment with 3 members (real pods):")
        print(demo_report.assignment_table(first, {}))
        print()
        _show_zones(node, first)
        _show_sidecars(node, first)
        print()
        step("scaling the consumer Deployment to 5")
        second = _scale(node, 5, timeout)
        _note_generations(first, second)
        show_change(first, second, {p: "new" for p in set(second.members) - set(first.members)})
        _show_zones(node, second)
        _show_sidecars(node, second)
        print()
        step("scaling the consumer Deployment to 4")
        third = _scale(node, 4, timeout)
        _note_generations(second, third)
        show_change(second, third, {})
        _show_zones(node, third)
        _show_sidecars(node, third)
        print()
        step(f"kubectl get consumergroups -n {NAMESPACE} -o wide")
        print(node.kubectl("get", "consumergroups", "-n", NAMESPACE, "-o", "wide").stdout.rstrip())
        print()
        step(f"kubectl get pods -n {NAMESPACE} -o wide")
        print(node.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout.rstrip())
        print()
    except (DemoError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
        print(f"demo failed: {exc}\n{detail}\n{node.logs(15)}")
        return 1
    except KeyboardInterrupt:
        print("interrupted")
        return 130
    finally:
        if keep_journal is not None and node.running:
            _keep_journal(node, keep_journal / "demo-operator.log")
        step("tearing the node down (pods, containerd, iptables rules, bridge, mounts)")
        node.stop()
    step(f"done in {time.monotonic() - started:.1f} s")
    return 0
