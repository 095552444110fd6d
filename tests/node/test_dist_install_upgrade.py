"""The release files alone, on a fresh real node: README's "Install on a cluster" run as written (the
image imported from its OCI archive, the CRDs and the chart from the chart's .tgz, the injector on), a
plain consumer Deployment with only the annotation gets its sidecar and joins its group. Then, on the
same node wiped clean, the previous release (hack/previous-release) with live groups, upgraded by
docs/deploy.md's "Upgrading" as written: no new generation, no queue moved, the status kept, the
Lease handed from the old operator to the new one with no moment of two holders.

dist/ comes from `make release` and the previous release's from `make release-previous` (the
background build step of .ci/run makes both); a missing or stale one fails the test naming the
target. Runs before the session's node (this file sorts first): one node runs per machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.node import host
from harness.node.cluster import RealNode
from harness.node.images import Images, images_manifest
from harness.node.requirements import unavailable
from harness.node.specs import NODE_IP
from harness.node.workload import (
    GROUP,
    NAMESPACE,
    OPERATOR,
    RELEASE_NAMESPACE,
    assignment,
    group_status_for,
    helm,
    is_ready,
    kubectl_json,
    operator_pod,
    pods,
    wait_members,
)
from harness.polling import scaled, wait_for
from mqbalance.contract import AssignmentDocument
from tests.integration.invariants import check_document
from tests.node.node_support import check_each_sidecar, example_readable

REPO = Path(__file__).resolve().parents[2]
DIST = Path(os.environ.get("MQBALANCE_DIST") or REPO / "dist")
SECOND_GROUP = "payments-consumer"
IMAGE_REPOSITORY = "docker.io/mqbalance/mqbalance"
CONSUMER_APP = """
import json, os, signal, sys, time, urllib.request
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
url, after = os.environ["MQBALANCE_URL"], -1
while True:
    try:
        with urllib.request.urlopen(f"{url}/v1/queues?after={after}&timeout=30", timeout=40) as answer:
            view = json.load(answer)
        after = view["generation"]
        print(json.dumps({"generation": after, "queues": view["queues"]}), flush=True)
    except (OSError, ValueError):
        time.sleep(1)
"""
"""The consumers' app: README's loop over the sidecar's HTTP API, standard library only, so that it runs
in either release's image."""


# -- the release files ---------------------------------------------------------------------------


def project_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def release_record(dist: Path) -> dict[str, str]:
    """dist/RELEASE: version, commit and source id, one ``key value`` a line."""
    lines = (dist / "RELEASE").read_text().splitlines()
    return dict(line.split(" ", 1) for line in lines if " " in line)


def current_dist() -> Path:
    """dist/ of this tree, or the test fails saying how to make it."""
    version = project_version()
    wanted = [f"mqbalance-{version}.tgz", f"mqbalance-image-{version}.oci.tar", "RELEASE", "SHA256SUMS"]
    missing = [name for name in wanted if not (DIST / name).is_file()]
    if missing:
        pytest.fail(f"{DIST} lacks {', '.join(missing)} of release {version}: run `make release` first")
    record = release_record(DIST)
    source = subprocess.run(
        ["bash", str(REPO / "hack" / "release.sh"), "--print-source-id"],
        capture_output=True, text=True, check=True, timeout=scaled(60),
    ).stdout.strip()  # fmt: skip
    if (record.get("version"), record.get("source")) != (version, source):
        pytest.fail(
            f"{DIST} is stale: made of version {record.get('version')} at commit {record.get('commit')}"
            f" (sources {record.get('source', '?')[:12]}), the tree is {version} (sources {source[:12]}):"
            " run `make release` first"
        )
    return DIST


def previous_dist() -> tuple[str, Path]:
    """(version, dist/) of the previous release; skips in a clone without its commit."""
    line = next(x for x in (REPO / "hack" / "previous-release").read_text().splitlines() if x[:1].isdigit())
    version, commit = line.split()
    known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], check=False)
    if known.returncode != 0:
        pytest.skip(
            f"the previous release {version} (commit {commit}) is not in this clone's history (a shallow"
            f" clone?): run `git fetch --unshallow` (or `git fetch origin {commit}`), then"
            " `make release-previous`"
        )
    script = REPO / "hack" / "build-previous-release.sh"
    where = subprocess.run(["bash", str(script), "--print-dir"], capture_output=True, text=True, check=True)
    dist = Path(where.stdout.strip())
    if not (dist / "SHA256SUMS").is_file():
        pytest.fail(
            f"the previous release {version} is not built at {dist}: run `make release-previous` first"
        )
    return version, dist


def manifest_digests(archive: Path) -> set[str]:
    """The digests an image imported from ``archive`` can be known by: its manifest's and its config's."""
    with tarfile.open(archive) as tar:

        def blob(name: str) -> Any:
            member = tar.extractfile(name)
            assert member is not None, name
            return json.load(member)

        manifest = blob("index.json")["manifests"][0]["digest"]
        config = blob("blobs/sha256/" + manifest.split(":", 1)[1])["config"]["digest"]
    return {manifest, config}


# -- the documented steps, run as written ----------------------------------------------------------


def shell_block(doc: Path, heading: str) -> str:
    """The first ```sh block under the Markdown heading ``heading`` of ``doc``."""
    text = doc.read_text()
    found = re.search(rf"^#+ {re.escape(heading)}\n(.*?)^```sh\n(.*?)^```", text, re.M | re.S)
    assert found is not None, f"{doc}: no sh block under {heading}"
    assert not re.search(r"^#+ ", found.group(1), re.M), f"{doc}: no sh block in the section {heading}"
    return found.group(2)


def run_block(node: RealNode, block: str, cwd: Path) -> str:
    """Run ``block`` in bash in ``cwd``, with kubectl, helm and ctr pointed at the node (the only change
    to what a user runs: which cluster and which containerd)."""
    prelude = "\n".join(
        [
            "set -euo pipefail",
            f'kubectl() {{ {node.bin_dir / "kubectl"} --kubeconfig {node.kubeconfig} "$@"; }}',
            f'helm() {{ {node.helm} --kubeconfig {node.kubeconfig} "$@"; }}',
            f'ctr() {{ command ctr --address {node.spec().socket} "$@"; }}',
            "set -x",
        ]
    )
    result = subprocess.run(
        ["bash", "-c", f"{prelude}\n{block}"],
        cwd=cwd, capture_output=True, text=True, timeout=scaled(600), check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"the documented steps failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def workdir(base: Path, dist: Path, groups: dict[str, int], version: str) -> Path:
    """``base`` with ``dist/`` (the release files) and ``examples/`` beside it, as in a checkout after
    `make release`. The consumers' Deployment is examples/consumer-deployment-injected.yaml with an app
    that is there (the example's registry.example.com image is not): the project's image running the
    test consumer, which long-polls its sidecar. ``groups``: group -> replicas, the first the example's."""
    base.mkdir(parents=True)
    (base / "dist").mkdir()
    for f in dist.iterdir():
        (base / "dist" / f.name).symlink_to(f)
    examples = base / "examples"
    examples.mkdir()
    source = REPO / "examples"
    (examples / "topic.yaml").write_text((source / "topic.yaml").read_text())
    group = yaml.safe_load((source / "consumergroup.yaml").read_text())
    deployment = yaml.safe_load((source / "consumer-deployment-injected.yaml").read_text())
    app = deployment["spec"]["template"]["spec"]["containers"][0]
    app["image"] = f"mqbalance/mqbalance:{version}"
    app["command"] = ["python", "-c", CONSUMER_APP]
    groups_yaml, deployments_yaml = [], []
    for name, replicas in groups.items():
        g, d = rename(group, name), rename(deployment, name)
        d["spec"]["replicas"] = replicas
        groups_yaml.append(g)
        deployments_yaml.append(d)
    (examples / "consumergroup.yaml").write_text(yaml.safe_dump_all(groups_yaml))
    (examples / "consumer-deployment-injected.yaml").write_text(yaml.safe_dump_all(deployments_yaml))
    return base


def rename(document: dict[str, Any], name: str) -> dict[str, Any]:
    """The example group or Deployment for the group ``name``: its name, labels and annotation."""
    text = json.dumps(document).replace(f'"{GROUP}"', f'"{name}"')
    renamed: dict[str, Any] = json.loads(text)
    return renamed


# -- the node ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dist() -> Path:
    return current_dist()


@pytest.fixture(scope="module")
def node(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """A fresh node of its own (the session's would hold a dev release). Of `make images` it takes only
    the pod sandbox: every mqbalance container runs an image imported from the release files."""
    reason = unavailable()
    if reason is not None:
        pytest.fail(f"a real node cannot run here: {reason}")
    built = Images.load(images_manifest())
    sandbox = Images(built.mqbalance, built.pause, {built.pause: built.archives[built.pause]})
    real = RealNode(tmp_path_factory.mktemp("dist-node"), images=sandbox)
    began = time.monotonic()
    with real:
        print(f"node Ready in {time.monotonic() - began:.1f} s")
        drop_release_images(real)  # the node's containerd root is a cache kept between runs
        yield real
    left = host.leftovers(NODE_IP, [real.containerd_root])
    assert left == [], f"the node left these behind: {left}"


def release_images(node: RealNode) -> dict[str, str]:
    """Images named docker.io/mqbalance/mqbalance:* in the node's containerd: ref -> digest."""
    out = node.ctr("images", "list").stdout.splitlines()[1:]
    return {
        f[0]: f[2] for f in (line.split() for line in out) if f and f[0].startswith(IMAGE_REPOSITORY + ":")
    }


def drop_release_images(node: RealNode) -> None:
    node.ctr.remove_images(sorted(release_images(node)))
    assert release_images(node) == {}


def check_imported(node: RealNode, archive: Path, version: str) -> None:
    digest = release_images(node).get(f"{IMAGE_REPOSITORY}:{version}")
    assert digest in manifest_digests(archive), (digest, archive)


def check_pods_run_the_image(node: RealNode, group: str, archive: Path, version: str) -> None:
    """Each consumer pod has the sidecar the injector added, and every container runs the release image."""
    digests = manifest_digests(archive)
    for pod in pods(node, f"app={group}"):
        names = [c["name"] for c in pod["spec"]["containers"]]
        assert names == ["app", "mqbalance-sidecar"], names
        for status in pod["status"]["containerStatuses"]:
            assert status["image"] == f"{IMAGE_REPOSITORY}:{version}", status
            assert status["imageID"].rsplit("@", 1)[-1] in digests, status


def wipe(node: RealNode) -> None:
    """Consumers, the release, its namespaces, the CRDs and the release images gone, whichever of them
    an earlier test left: the node as after its start."""
    node.kubectl("delete", "deployments", "--all", "-n", NAMESPACE, "--ignore-not-found", timeout=180)
    wait_for("the consumer pods gone", lambda: not pods(node, "mqbalance.io/sidecar=true"), 180, 0.5)
    helm(node, "uninstall", "mqbalance", "-n", RELEASE_NAMESPACE, "--wait", "--ignore-not-found")
    for namespace in (NAMESPACE, RELEASE_NAMESPACE):
        node.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=180)
    crds = ("consumergroups.mqbalance.io", "topics.mqbalance.io", "offsetresets.mqbalance.io")
    node.kubectl("delete", "crd", *crds, "--ignore-not-found", "--wait=true")
    drop_release_images(node)


# -- the tests -----------------------------------------------------------------------------------


def test_readme_install_from_the_release_files_injects_the_sidecar_and_the_pods_join(
    node: RealNode, dist: Path, tmp_path: Path
) -> None:
    version = project_version()
    block = shell_block(REPO / "README.md", "Install on a cluster")
    began = time.monotonic()
    out = run_block(node, block, workdir(tmp_path / "user", dist, {GROUP: 3}, version))
    installed = time.monotonic() - began
    assert GROUP in out, out  # kubectl get consumergroups, the last step
    archive = dist / f"mqbalance-image-{version}.oci.tar"
    check_imported(node, archive, version)

    doc = wait_members(node, 3)
    joined = time.monotonic() - began
    check_document(doc, example_readable())
    check_pods_run_the_image(node, GROUP, archive, version)
    check_each_sidecar(node, doc)
    operator = kubectl_json(node, "get", "pod", "-n", RELEASE_NAMESPACE, operator_pod(node))
    assert operator["status"]["containerStatuses"][0]["image"] == f"{IMAGE_REPOSITORY}:{version}"
    print(f"README's steps {installed:.1f} s; three pods members {joined:.1f} s after the first step")


class LeaseWatch:
    """Every version of the operator's Lease, from a watch started before the upgrade (kubectl get -w)."""

    def __init__(self, node: RealNode) -> None:
        argv = [
            str(node.bin_dir / "kubectl"), "--kubeconfig", str(node.kubeconfig),
            "get", "lease", "-n", RELEASE_NAMESPACE, OPERATOR,
            "--watch", "--output-watch-events", "-o", "json",
        ]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.versions: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self.process.stdout:
            buffer += line
            try:
                event, _ = decoder.raw_decode(buffer.strip())
            except ValueError:
                continue
            buffer = ""
            self.versions.append(event["object"])

    def stop(self) -> list[dict[str, Any]]:
        self.process.terminate()
        self.process.wait(timeout=10)
        self._reader.join(timeout=10)
        return self.versions


def operator_metrics(node: RealNode, pod: str) -> str:
    code = (
        "import urllib.request as u; "
        "print(u.urlopen('http://127.0.0.1:8080/metrics', timeout=10).read().decode())"
    )
    return node.kubectl("exec", "-n", RELEASE_NAMESPACE, pod, "--", "python", "-c", code, timeout=60).stdout


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` with ``labels`` (0 when there is none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            sample_labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if all(sample_labels.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def ready_pod_names_of(node: RealNode, group: str) -> set[str]:
    return {p["metadata"]["name"] for p in pods(node, f"app={group}") if is_ready(p)}


def group_state(node: RealNode, group: str) -> tuple[str, AssignmentDocument, dict[str, Any]]:
    """The group's assignment ConfigMap's resourceVersion, its document and the group's status."""
    cm = kubectl_json(node, "get", "configmap", "-n", NAMESPACE, f"{group}-assignment")
    doc = assignment(node, group=group)
    assert doc is not None
    return cm["metadata"]["resourceVersion"], doc, group_status_for(node, doc.generation, group=group)


def test_upgrade_from_the_previous_release_moves_no_queue_and_hands_the_lease_over(
    node: RealNode, dist: Path, tmp_path: Path
) -> None:
    previous, previous_files = previous_dist()
    version = project_version()
    groups = {GROUP: 3, SECOND_GROUP: 2}
    wipe(node)
    # The previous release installed as its own documents said, from its release files: the CRDs
    # with a client-side kubectl apply, the chart, the injector, the labelled namespace, the consumers.
    old = workdir(tmp_path / "previous", previous_files, groups, previous)
    run_block(
        node,
        f"""cd dist
ctr -n k8s.io images import mqbalance-image-{previous}.oci.tar
helm show crds mqbalance-{previous}.tgz | kubectl apply -f -
kubectl create namespace shop
helm install mqbalance mqbalance-{previous}.tgz -n mqbalance --create-namespace --wait \\
  --set 'sidecar.namespaces={{shop}}' --set 'sidecar.groups={{{GROUP},{SECOND_GROUP}}}' \\
  --set injector.enabled=true
kubectl label namespace shop mqbalance.io/sidecar-injection=enabled
kubectl apply -n shop -f ../examples/topic.yaml -f ../examples/consumergroup.yaml \\
  -f ../examples/consumer-deployment-injected.yaml
""",
        old,
    )
    check_imported(node, previous_files / f"mqbalance-image-{previous}.oci.tar", previous)
    for group, replicas in groups.items():

        def joined(group: str = group, replicas: int = replicas) -> bool:
            doc = assignment(node, group=group)
            ready = ready_pod_names_of(node, group)
            return doc is not None and len(ready) == replicas and set(doc.members) == ready

        wait_for(f"{replicas} pods of {group} members", joined, 180, 0.5)
    old_operator = operator_pod(node)
    old_metrics = operator_metrics(node, old_operator)
    assert metric(old_metrics, "mqbalance_build_info", component="operator", version=previous) == 1
    before = {group: group_state(node, group) for group in groups}
    lease_before = kubectl_json(node, "get", "lease", "-n", RELEASE_NAMESPACE, OPERATOR)["spec"]
    assert lease_before["holderIdentity"] == old_operator

    # The upgrade, as docs/deploy.md says, from the new release's files.
    watch = LeaseWatch(node)
    wait_for("the Lease watch to start", lambda: watch.versions, 30, 0.2)
    began = time.monotonic()
    new = workdir(tmp_path / "current", dist, groups, version)
    run_block(node, shell_block(REPO / "docs" / "deploy.md", "Upgrading"), new)
    upgraded = time.monotonic() - began

    def new_operator_working() -> str | None:
        pod = operator_pod(node)
        if (
            pod == old_operator
            or len(pods(node, "app.kubernetes.io/component=operator", RELEASE_NAMESPACE)) != 1
        ):
            return None
        # Both groups reconciled by the new operator: each found its assignment current.
        text = operator_metrics(node, pod)
        return pod if metric(text, "mqbalance_reconciles_total", result="unchanged") >= len(groups) else None

    new_operator = wait_for(
        "the new operator alone, having reconciled every group", new_operator_working, 120, 1
    )
    took_over = time.monotonic() - began
    versions = watch.stop()
    text = operator_metrics(node, new_operator)
    assert metric(text, "mqbalance_build_info", component="operator", version=version) == 1
    assert metric(text, "mqbalance_reconciles_total", result="published") == 0, text
    assert metric(text, "mqbalance_rebalances_total") == 0

    # No write to any assignment (the same resourceVersion: no new generation, no queue moved), the
    # status as it was.
    for group in groups:
        rv, doc, status = before[group]
        rv_after, doc_after, status_after = group_state(node, group)
        assert doc_after.generation == doc.generation, group
        assert doc_after.encode() == doc.encode(), group
        assert rv_after == rv, group
        assert status_after == status, group
    check_each_sidecar(node, before[GROUP][1])

    # The Lease: the old operator held it, released it (no holder), then the new one took it, one
    # transition; never the new holder while the old one still held it.
    holders = [v["spec"].get("holderIdentity") or "" for v in versions]
    distinct = [h for i, h in enumerate(holders) if i == 0 or h != holders[i - 1]]
    assert distinct == [old_operator, "", new_operator], holders
    taken = [v["spec"] for v in versions if v["spec"].get("holderIdentity") == new_operator]
    transitions = {int(spec.get("leaseTransitions") or 0) for spec in taken}
    assert transitions == {int(lease_before.get("leaseTransitions") or 0) + 1}, taken

    # The new operator works: one more pod is one more generation, and it gets the new sidecar.
    node.kubectl("scale", "-n", NAMESPACE, f"deploy/{GROUP}", "--replicas=4")
    doc = wait_members(node, 4)
    assert doc.generation == before[GROUP][1].generation + 1
    fresh = [p for p in pods(node) if p["metadata"]["name"] not in before[GROUP][1].members]
    sidecars = [
        c["image"] for p in fresh for c in p["spec"]["containers"] if c["name"] == "mqbalance-sidecar"
    ]
    assert sidecars == [f"mqbalance/mqbalance:{version}"], sidecars
    print(
        f"upgrade steps {upgraded:.1f} s; the new operator alone and reconciled {took_over:.1f} s after them"
    )
