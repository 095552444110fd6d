"""The local demo (`make demo`): the whole system on a throw-away local cluster.

Two modes. On real pods (harness.demo.node) when a real node can run here: root, the node
binaries and images built (``make node images``), containerd usable. Otherwise the stand-in
mode below, which needs only the control plane; the demo says which mode it runs and why.

Stand-in mode: builds or reuses the control plane (kube-apiserver, etcd, kube-controller-manager), installs
the CRDs, applies examples/topic.yaml (three brokers in three zones) and
examples/consumergroup.yaml (STICKY with zone affinity), acts out nodes and consumer pods in
three zones, runs the operator and one pod's sidecar as local processes, scales the group up
and down, and prints each assignment, the queues that moved, and what the sidecar serves.
Everything it started is stopped at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness import polling
from harness.apps.argv import mqbalance_argv
from harness.apps.operator import OperatorProcess
from harness.demo import report as demo_report
from harness.demo.common import DemoError, print_sidecar, show_change, step
from harness.kube.api import ApiError
from harness.kube.cluster import CRD_NAMES, LocalCluster
from harness.kube.errors import ClusterError
from harness.paths import REPO
from harness.processes.managed import ManagedProcess
from harness.processes.net import free_port
from mqbalance.contract import CONFIGMAP_KEY, AssignmentDocument, DocumentError, configmap_name

CRDS = REPO / "crds"
EXAMPLES = REPO / "examples"
NAMESPACE = "mqbalance-demo"
GROUP = "orders-consumer"
APP_LABELS = {"app": "orders-consumer"}
ZONES = ("zone-a", "zone-b", "zone-c")
SIDECAR_POD = f"{GROUP}-0"


class Demo:
    def __init__(self, cluster: LocalCluster, workdir: Path, timeout: float) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.timeout = timeout
        self.api = cluster.api
        self.processes: list[ManagedProcess] = []
        self.sidecar_port = 0

    def close(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    # -- Kubernetes ------------------------------------------------------------------------------

    def install(self) -> None:
        step("installing the CRDs: kubectl apply -f crds/")
        self.cluster.apply_crds(CRDS, CRD_NAMES)
        self.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        step(f"applying examples/topic.yaml and examples/consumergroup.yaml in namespace {NAMESPACE}")
        for name in ("topic.yaml", "consumergroup.yaml"):
            self.cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLES / name))

    def create_nodes(self) -> list[str]:
        from harness.kube.kubelet import create_node

        nodes = [f"node-{zone}" for zone in ZONES]
        for node, zone in zip(nodes, ZONES, strict=True):
            create_node(self.api, node, zone)
        step(f"created nodes {', '.join(f'{n} ({z})' for n, z in zip(nodes, ZONES, strict=True))}")
        return nodes

    def start_pod(self, index: int, node: str) -> str:
        from harness.kube.kubelet import bind_pod, create_pod, set_pod_ready

        name = f"{GROUP}-{index}"
        create_pod(self.api, NAMESPACE, name, APP_LABELS)
        bind_pod(self.api, NAMESPACE, name, node)
        set_pod_ready(self.api, NAMESPACE, name)
        return name

    def delete_pod(self, name: str) -> None:
        from harness.kube.kubelet import delete_pod

        delete_pod(self.api, NAMESPACE, name)

    def published(self) -> AssignmentDocument | None:
        status, cm = self.api.call(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{configmap_name(GROUP)}"
        )
        if status == 404:
            return None
        if status != 200:
            raise ApiError(status, str(cm))
        text = (cm.get("data") or {}).get(CONFIGMAP_KEY)
        if text is None:
            return None
        try:
            return AssignmentDocument.decode(text)
        except DocumentError:
            return None

    def wait_for_members(self, members: set[str]) -> AssignmentDocument:
        def probe() -> AssignmentDocument | None:
            for process in self.processes:
                process.check()
            doc = self.published()
            return doc if doc is not None and set(doc.members) == members else None

        return polling.wait_for(
            f"an assignment with members {sorted(members)}", probe, self.timeout, 0.1, DemoError
        )

    def wait_for_status(self, generation: int) -> None:
        """Wait (briefly) for the ConsumerGroup's status to describe ``generation``."""
        path = f"/apis/mqbalance.io/v1alpha1/namespaces/{NAMESPACE}/consumergroups/{GROUP}"

        def probe() -> bool | None:
            body = self.api.request("GET", path)
            return True if (body.get("status") or {}).get("assignmentGeneration") == generation else None

        try:
            polling.wait_for("the ConsumerGroup status", probe, min(self.timeout, 15.0), 0.2, DemoError)
        except DemoError:
            print(f"   (the status does not show generation {generation} yet)")

    # -- processes -------------------------------------------------------------------------------

    def start_operator(self) -> None:
        step(f"starting the operator: mqbalance operator --namespace {NAMESPACE}")
        operator = OperatorProcess(self.cluster, [NAMESPACE], self.workdir, error=DemoError)
        operator.spawn()
        self.processes.append(operator)

    def start_sidecar(self) -> None:
        self.sidecar_port = free_port()
        metrics_port = free_port()
        env = {
            **self.cluster.env,
            "POD_NAME": SIDECAR_POD,
            "POD_NAMESPACE": NAMESPACE,
            "MQBALANCE_GROUP": GROUP,
            "MQBALANCE_SIDECAR_PORT": str(self.sidecar_port),
            "MQBALANCE_METRICS_HOST": "127.0.0.1",
            "MQBALANCE_METRICS_PORT": str(metrics_port),
        }
        api = f"127.0.0.1:{self.sidecar_port}"
        step(f"starting the sidecar of pod {SIDECAR_POD}: mqbalance sidecar (API on {api})")
        sidecar = ManagedProcess(
            "sidecar", mqbalance_argv("sidecar"), env, self.workdir / "sidecar.log", DemoError
        )
        sidecar.spawn()
        self.processes.append(sidecar)

    def sidecar_queues(self, after: int) -> dict[str, Any]:
        """``GET /v1/queues`` once the sidecar serves a generation above ``after`` (a long poll)."""

        def probe() -> dict[str, Any] | None:
            for process in self.processes:
                process.check()
            url = f"http://127.0.0.1:{self.sidecar_port}/v1/queues?after={after}&timeout=5"
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    if resp.status != 200:
                        return None
                    body: dict[str, Any] = json.loads(resp.read())
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return None
            return body if body.get("generation", 0) > after else None

        what = f"the sidecar to serve a generation after {after}"
        return polling.wait_for(what, probe, self.timeout, 0.2, DemoError)

    # -- the story ---------------------------------------------------------------------------------

    def run(self) -> None:
        self.install()
        nodes = self.create_nodes()
        self.start_operator()

        members = {self.start_pod(i, nodes[i % 3]) for i in range(3)}
        step(f"started pods {', '.join(sorted(members))}, one per zone, Running and Ready")
        first = self.wait_for_members(members)
        print()
        print("Assignment with 3 members:")
        print(demo_report.assignment_table(first, {SIDECAR_POD: "<- has the sidecar"}))
        print()

        self.start_sidecar()
        print_sidecar(self.sidecar_queues(first.generation - 1))
        print()

        added = {self.start_pod(i, nodes[i % 3]) for i in (3, 4)}
        step(f"scaling up: started {', '.join(sorted(added))} in {ZONES[0]} and {ZONES[1]}")
        members |= added
        second = self.wait_for_members(members)
        show_change(first, second, {p: "new" for p in added} | {SIDECAR_POD: "<- has the sidecar"})
        print_sidecar(self.sidecar_queues(first.generation))
        print()

        gone = f"{GROUP}-1"
        step(f"scaling down: deleted {gone} ({ZONES[1]})")
        self.delete_pod(gone)
        members.discard(gone)
        third = self.wait_for_members(members)
        show_change(second, third, {SIDECAR_POD: "<- has the sidecar"})
        print_sidecar(self.sidecar_queues(second.generation))
        print()

        self.wait_for_status(third.generation)
        step(f"kubectl get consumergroups -n {NAMESPACE} -o wide")
        print(self.cluster.kubectl("get", "consumergroups", "-n", NAMESPACE, "-o", "wide").stdout.rstrip())
        print()


@contextlib.contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="mqbalance-demo-") as tmp:
        yield Path(tmp)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.demo",
        description="Run the operator and a sidecar on a throw-away local control plane, scale a consumer "
        "group up and down, and print the assignments and the queues that moved.",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for each step (default 60)"
    )
    parser.add_argument(
        "--keep-logs", type=Path, metavar="DIR", help="keep the operator and sidecar logs here"
    )
    parser.add_argument(
        "--keep-journal",
        type=Path,
        metavar="DIR",
        help="real pods: keep the operator's log, its rebalance journal, as DIR/demo-operator.log "
        "(for mqbalance replay --journal)",
    )
    parser.add_argument(
        "--mode",
        choices=("auto", "real", "stand-in"),
        default="auto",
        help="real pods (builds what is missing), the stand-in (pods acted out), or real when it can run "
        "here (default)",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    missing = [p for p in (CRDS, EXAMPLES / "topic.yaml", EXAMPLES / "consumergroup.yaml") if not p.exists()]
    if missing:
        print(
            f"the demo runs from a source checkout: {', '.join(map(str, missing))} not found. "
            "Clone the repository and run `make demo` there.",
            file=sys.stderr,
        )
        return 2
    if args.mode != "stand-in":
        from harness.node.requirements import unavailable

        reason = unavailable(need_built=args.mode == "auto")
        if reason is None:
            from harness.demo import node as demo_node

            step("mode: real pods (kubelet + containerd node; --mode stand-in for the stand-in)")
            return demo_node.run(args.keep_logs, args.timeout * 3, args.keep_journal)
        if args.mode == "real":
            print(f"a real node cannot run here: {reason}", file=sys.stderr)
            return 2
        step(f"mode: stand-in (pods acted out) because {reason}; `make demo-node` runs it on real pods")
    started = time.monotonic()
    with _workdir(args.keep_logs) as workdir:
        step("starting the local control plane (built once and cached; see docs/local-cluster.md)")
        # No Deployments here (the demo acts its pods out): no controller manager to build or start.
        cluster = LocalCluster(workdir / "cluster" if args.keep_logs else None, controller_manager=False)
        demo: Demo | None = None
        try:
            cluster.start()
            step(f"control plane (Kubernetes {cluster.version}) ready at {cluster.server}")
            demo = Demo(cluster, workdir, args.timeout)
            demo.run()
        except (DemoError, ClusterError, subprocess.CalledProcessError) as exc:
            detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
            print(f"demo failed: {exc}\n{detail}", file=sys.stderr)
            if demo is not None:
                for process in demo.processes:
                    print(f"--- {process.name} log ---\n{process.tail()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            step("stopping the sidecar, the operator and the control plane")
            if demo is not None:
                demo.close()
            cluster.stop()
    step(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
