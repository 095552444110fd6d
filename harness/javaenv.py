"""The world the Java client's tests run in: a real RocketMQ, a real API server and real sidecars.

``clients/java`` starts this module once per test run (``python -m harness.javaenv``) and reads
one JSON line from its stdout::

    {"namesrv": "127.0.0.1:PORT", "brokers": {"broker-a": "127.0.0.1:PORT", ...},
     "sidecars": {"p0": "http://127.0.0.1:PORT", "p1": ...},
     "assignmentFiles": {"GROUP": "PATH", ...}, "topics": {"TOPIC": QUEUES_PER_BROKER},
     "acl": {"version": "5.3.3", "namesrv": ..., "brokers": {...}, "accessKey": ..., "secretKey": ...}}

With ``--acl-version`` a second RocketMQ of that release runs with ACL on (``harness.rocketmq.acl.Acl``),
one broker ``ACL_BROKER`` holding the ``--acl-topic`` topics; the same sidecars serve its groups.

Every topic exists on both brokers and as a Topic resource (so the sidecars can select queues
for producers); every group's assignment is read by the sidecars from its file, which the tests
rewrite to publish a generation, as the operator does with the ConfigMap. Everything stops when
stdin closes (the JVM exited) or on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType

from harness import polling
from harness.kube.cluster import CRD_NAMES, LocalCluster
from harness.paths import REPO
from harness.processes.managed import ManagedProcess
from harness.processes.net import free_port
from harness.rocketmq.acl import Acl
from harness.rocketmq.releases import DEFAULT_VERSION
from harness.rocketmq.resources import topic_resource
from harness.rocketmq.server import RocketMQ

NAMESPACE = "java-it"
BROKERS = ("broker-a", "broker-b")
ACL_BROKER = "broker-acl"


def empty_document(group: str) -> str:
    # Generation 0 with no members: sidecars answer isMember=false until a test publishes.
    return json.dumps(
        {
            "group": group,
            "generation": 0,
            "strategy": "CONFIG",
            "messageModel": "CLUSTERING",
            "computedAt": time.time(),
            "reason": "initial",
            "members": {},
            "brokerZones": {},
            "topics": {},
        }
    )


@contextmanager
def sidecar(
    pod: str, groups: Sequence[str], files: dict[str, Path], kubeconfig: Path, logs: Path
) -> Iterator[str]:
    port = free_port()
    exe = shutil.which("mqbalance", path=str(Path(sys.executable).parent)) or "mqbalance"
    argv = [
        exe,
        "sidecar",
        f"--pod-name={pod}",
        f"--namespace={NAMESPACE}",
        f"--port={port}",
        "--metrics-port=0",
        f"--kubeconfig={kubeconfig}",
        *(f"--group={g}" for g in groups),
        *(f"--assignment-file={g}={files[g]}" for g in groups),
    ]
    proc = ManagedProcess(f"sidecar {pod}", argv, None, logs / f"sidecar-{pod}.log", RuntimeError, cwd=None)
    proc.spawn()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        proc.check()
        with urllib.request.urlopen(f"{url}/readyz", timeout=2):
            return True

    try:
        polling.wait_for(f"sidecar {pod} ready", ready, 60, 0.2, RuntimeError, retry_on=(OSError,))
        yield url
    finally:
        proc.stop(5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.javaenv", description=__doc__)
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME[:QUEUES[:LISTED]]",
        help="a topic of QUEUES queues on each broker whose Topic resource lists LISTED of them (all)",
    )
    parser.add_argument(
        "--route-only-topic",
        action="append",
        default=[],
        metavar="NAME[:QUEUES]",
        help="a Topic resource only: the sidecars route to it, the brokers do not have it (failed sends)",
    )
    parser.add_argument("--group", action="append", default=[])
    parser.add_argument("--pods", default="p0,p1", help="comma-separated pod names, one sidecar each")
    parser.add_argument("--version", default=DEFAULT_VERSION, help="the RocketMQ release of the two brokers")
    parser.add_argument("--acl-version", default=None, help="also a RocketMQ of this release with ACL on")
    parser.add_argument("--acl-topic", action="append", default=[], metavar="NAME[:QUEUES]")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def stop_on_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=stop_on_eof, daemon=True).start()

    workdir = Path(tempfile.mkdtemp(prefix="mqbalance-javaenv-"))
    logs = workdir / "logs"
    logs.mkdir()
    try:
        with ExitStack() as stack:
            mq = stack.enter_context(RocketMQ(args.version, brokers=BROKERS))
            cluster = stack.enter_context(LocalCluster())
            cluster.apply_crds(REPO / "crds", CRD_NAMES)
            cluster.kubectl("create", "namespace", NAMESPACE)
            topics: dict[str, int] = {}
            for spec in args.topic:
                name, _, rest = spec.partition(":")
                queues, _, listed = rest.partition(":")
                topics[name] = int(queues or 4)
                mq.create_topic(name, topics[name])
                # The Topic resource may list fewer queues than the brokers have: the sidecar then
                # selects only those, which tells its selection from the client's own.
                resource = topic_resource(name, NAMESPACE, BROKERS, int(listed or topics[name]))
                cluster.kubectl("apply", "-f", "-", input=json.dumps(resource))
            for spec in args.route_only_topic:
                name, _, queues = spec.partition(":")
                cluster.kubectl(
                    "apply",
                    "-f",
                    "-",
                    input=json.dumps(topic_resource(name, NAMESPACE, BROKERS, int(queues or 4))),
                )
            acl: dict[str, object] | None = None
            if args.acl_version:
                credentials = Acl()
                secured = stack.enter_context(
                    RocketMQ(args.acl_version, brokers=(ACL_BROKER,), acl=credentials)
                )
                for spec in args.acl_topic:
                    name, _, queues = spec.partition(":")
                    secured.create_topic(name, int(queues or 4))
                acl = {
                    "version": args.acl_version,
                    "namesrv": secured.namesrv_addr,
                    "brokers": {ACL_BROKER: secured.broker_addr(ACL_BROKER)},
                    "accessKey": credentials.client.access_key,
                    "secretKey": credentials.client.secret_key,
                    "logs": str(secured.workdir / "logs"),
                }
            files = {}
            for group in args.group:
                files[group] = workdir / f"{group}.json"
                files[group].write_text(empty_document(group))
            sidecars = {
                pod: stack.enter_context(sidecar(pod, args.group, files, cluster.kubeconfig, logs))
                for pod in args.pods.split(",")
            }
            print(
                json.dumps(
                    {
                        "namesrv": mq.namesrv_addr,
                        "brokers": {b: mq.broker_addr(b) for b in BROKERS},
                        "sidecars": sidecars,
                        "assignmentFiles": {g: str(p) for g, p in files.items()},
                        "topics": topics,
                        "logs": str(logs),
                        "rocketmqLogs": str(mq.workdir / "logs"),
                        "acl": acl,
                    }
                ),
                flush=True,
            )
            stop.wait()
    finally:
        if os.environ.get("MQBALANCE_KEEP_LOGS"):
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
