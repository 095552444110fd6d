"""The replay on Spark on Kubernetes, on a real node: ``spark-submit --master k8s://... --deploy-mode
cluster`` of ``mqbalance replay`` in the replay image (pipeline/Dockerfile, built by
hack/build-images.sh), its driver and executors real pods that read the journal from and write the
report to a PersistentVolumeClaim. docs/pipeline.md, "On Kubernetes", is the same run by hand.

Pods have no DNS on the real node (docs/real-node.md), so the driver reaches the API server by the
``kubernetes`` Service's IP and the executors reach the driver by its pod IP
(``spark.kubernetes.executor.useDriverPodIP``) instead of the driver Service's name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.kube.errors import ClusterError
from harness.kube.profile import SERVICE_IP
from harness.node.cluster import RealNode
from harness.node.images import images_manifest
from harness.node.workload import apply, kubectl_json
from harness.polling import scaled, wait_for

APP = "mqbalance-replay"
DRIVER_POD = f"{APP}-driver"
DATA_POD = f"{APP}-data"
CLAIM = f"{APP}-data"
MOUNT = "/data"
SPARK_UID = 185
"""The replay image's user (Spark's images' uid)."""
MAIN = "local:///opt/mqbalance/lib/python3.11/site-packages/mqbalance/pipeline/main.py"
"""The replay's entry point inside the image (``local://``: a file of the image, nothing uploaded)."""


@dataclass(frozen=True)
class ReplayImage:
    image: str
    archive: Path
    pyspark: str


def replay_image(manifest: Path | None = None) -> ReplayImage:
    """The replay image hack/build-images.sh built (it needs the .venv's PySpark: ``make venv``)."""
    path = manifest or images_manifest()
    try:
        entry = json.loads(path.read_text())["replay"]
        image = ReplayImage(entry["image"], Path(entry["archive"]), entry["pyspark"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"no replay image in {path} ({exc!r}); run make venv images") from None
    if not image.archive.is_file():
        raise ClusterError(f"replay image archive {image.archive} missing; run make images")
    return image


def import_image(node: RealNode, image: ReplayImage) -> None:
    """Import the replay image into the node's containerd when missing; older builds removed. It is
    not in ``Images`` (imported at every node start): only the replay's tests need its 1 GB."""
    ctr = node.node_ctr()
    present = ctr.images()
    if image.image not in present:
        ctr.import_image(image.archive, image.image)
    ctr.remove_images(
        sorted(r for r in present if r.startswith("localhost/mqbalance-replay:") and r != image.image)
    )


def data_volume(node: RealNode, namespace: str, host_dir: Path) -> None:
    """A PersistentVolumeClaim ``CLAIM`` bound to a hostPath PersistentVolume on ``host_dir``: the
    one node's stand-in for the shared (ReadWriteMany) volume a cluster's storage class gives."""
    host_dir.mkdir(parents=True, exist_ok=True)
    os.chown(host_dir, SPARK_UID, 0)
    volume = f"{namespace}-{CLAIM}"
    apply(
        node,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(host_dir), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": CLAIM},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )

    def bound() -> bool:
        claim = kubectl_json(node, "get", "pvc", "-n", namespace, CLAIM)
        return bool(claim.get("status", {}).get("phase") == "Bound")

    wait_for(f"PersistentVolumeClaim {CLAIM} bound", bound, 30, 0.5)


def data_pod(node: RealNode, namespace: str, image: ReplayImage) -> None:
    """A pod of the replay image with the claim at ``MOUNT``, for ``kubectl cp`` in and out."""
    apply(
        node,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": DATA_POD, "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "data",
                        "image": image.image,
                        "imagePullPolicy": "Never",
                        "args": ["sleep", "infinity"],
                        "volumeMounts": [{"name": "data", "mountPath": MOUNT}],
                    }
                ],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
            },
        },
    )
    node.kubectl("wait", "-n", namespace, f"pod/{DATA_POD}", "--for=condition=Ready",
                 f"--timeout={scaled(90):.0f}s", timeout=scaled(90) + 20)  # fmt: skip


def spark_submit_argv(
    node: RealNode, image: ReplayImage, namespace: str, service_account: str, app_args: list[str]
) -> list[str]:
    """The spark-submit command line of the installed PySpark (the image's Spark version)."""
    volume = "spark.kubernetes.{role}.volumes.persistentVolumeClaim.data.{key}"
    conf = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": image.image,
        "spark.kubernetes.container.image.pullPolicy": "Never",
        "spark.kubernetes.authenticate.driver.serviceAccountName": service_account,
        "spark.kubernetes.driver.pod.name": DRIVER_POD,
        "spark.kubernetes.executor.podNamePrefix": APP,
        # No DNS in the pods: the API server by the kubernetes Service's IP, the driver by its pod IP.
        "spark.kubernetes.driver.master": f"https://{SERVICE_IP}:443",
        "spark.kubernetes.executor.useDriverPodIP": "true",
        "spark.executor.instances": "2",
        # The first job waits for both executors (a pod start under load can take a minute), and
        # tasks go to whichever executor is free: each of the two runs some of the replay.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{scaled(120):.0f}s",
        "spark.locality.wait": "0s",
        # Two cores on the node: small CPU requests let the driver and both executors be scheduled.
        "spark.kubernetes.driver.request.cores": "200m",
        "spark.kubernetes.executor.request.cores": "200m",
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        # Short runs: the JVMs' JIT and GC tuned for start-up, as harness/spark/cluster.py does.
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.ui.enabled": "false",
        # A journal of a few hundred lines: four shuffle partitions (not 200), kept four (adaptive
        # execution would coalesce them into one task, on one executor).
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        # Kept after the run, for the test to read their state and logs; deleted by clean_up().
        "spark.kubernetes.executor.deleteOnTermination": "false",
        **{volume.format(role=r, key="mount.path"): MOUNT for r in ("driver", "executor")},
        **{volume.format(role=r, key="options.claimName"): CLAIM for r in ("driver", "executor")},
    }
    spark_submit = Path(sys.executable).parent / "spark-submit"
    argv = [str(spark_submit), "--master", f"k8s://{node.server}", "--deploy-mode", "cluster", "--name", APP]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, MAIN, *app_args]


@dataclass
class Submitted:
    returncode: int
    output: str
    seconds: float


def spark_submit(node: RealNode, argv: list[str], timeout: float) -> Submitted:
    """Run spark-submit against the node (it waits for the application to end) with the admin
    kubeconfig, as a user's would; ``timeout`` unscaled."""
    import pyspark

    # The script looks for Spark with the python3 on PATH, which need not be this one.
    spark_home = str(Path(pyspark.__file__).parent)
    env = {
        **os.environ,
        "KUBECONFIG": str(node.kubeconfig),
        "SPARK_HOME": spark_home,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    start = time.monotonic()
    result = subprocess.run(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=scaled(timeout), check=False,
    )  # fmt: skip
    return Submitted(result.returncode, result.stdout, time.monotonic() - start)


def spark_pods(node: RealNode, namespace: str, role: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl_json(
        node, "get", "pods", "-n", namespace, "-l", f"spark-role={role},spark-app-name={APP}"
    )["items"]
    return items


def clean_up(node: RealNode, namespace: str) -> None:
    """Delete the run's pods, the driver's Service and ConfigMaps, the claim and its volume."""
    node.kubectl("delete", "pods", "-n", namespace, "-l", f"spark-app-name={APP}", "--wait=false",
                 check=False)  # fmt: skip
    node.kubectl("delete", "pod", "-n", namespace, DATA_POD, "--grace-period=1", check=False, timeout=120)
    node.kubectl("delete", "pvc", "-n", namespace, CLAIM, "--wait=false", check=False)
    node.kubectl("delete", "pv", f"{namespace}-{CLAIM}", "--wait=false", check=False)
