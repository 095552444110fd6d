"""Act out what kubelets and the scheduler would do, against a real API server.

The local control plane (:mod:`harness.kube.cluster`) runs no kubelet and no scheduler.
These helpers create Nodes with zone labels, create Pods, bind them with the ``binding``
subresource and patch their status to Running/Ready, so membership looks as it would in a
real cluster. They talk through the harness's one client (:class:`harness.kube.api.KubeApi`, or
the ``ApiClient`` it rides on) and return the objects as the API server answers them (JSON).

Deletion without a kubelet: a *bound* pod deleted with a grace period keeps its
``deletionTimestamp`` forever (the kubelet normally finishes the deletion), so
:func:`delete_pod` deletes with ``gracePeriodSeconds=0``. Unbound pods disappear at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from harness.kube.api import ApiClient, ApiError, KubeApi
from harness.polling import wait_for

Api = KubeApi | ApiClient
"""The harness's client, or the ``ApiClient`` it rides on (the tests' fixtures hand out that)."""
Obj = dict[str, Any]
STRATEGIC = "application/strategic-merge-patch+json"

ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
CONSUMER_IMAGE = "example/consumer"
# Holds a deleted pod in Terminating (deletionTimestamp set) until delete_pod removes it.
HOLD_FINALIZER = "testing.mqbalance.io/hold"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_ip(namespace: str, name: str) -> str:
    # Stable fake address from the pod's identity, in a range no real traffic goes to.
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return f"10.244.{digest[0]}.{1 + digest[1] % 254}"


def _kube(api: Api) -> KubeApi:
    return api if isinstance(api, KubeApi) else KubeApi(api)


def _pod_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def _node_conditions(ready: bool) -> list[dict[str, Any]]:
    now = _now()
    return [
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "acted out by harness.kube.kubelet",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
    ]


def create_node(
    api: Api,
    name: str,
    zone: str | None,
    zone_label: str = ZONE_LABEL,
    *,
    labels: Mapping[str, str] | None = None,
    ready: bool = True,
) -> Obj:
    """Create a Node labelled with its zone (no label when ``zone`` is None) and mark it Ready."""
    all_labels = {HOSTNAME_LABEL: name, **(labels or {})}
    if zone is not None:
        all_labels[zone_label] = zone
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": all_labels}}
    _kube(api).request("POST", "/api/v1/nodes", node)
    return set_node_ready(api, name, ready)


def set_node_ready(api: Api, name: str, ready: bool = True) -> Obj:
    """Patch the Node's Ready condition, as a kubelet's status update would."""
    body = {"status": {"conditions": _node_conditions(ready)}}
    return _kube(api).request("PATCH", f"/api/v1/nodes/{name}/status", body, STRATEGIC)


def set_node_zone(api: Api, name: str, zone: str | None, zone_label: str = ZONE_LABEL) -> Obj:
    """Set (or with ``zone=None`` remove) the Node's zone label."""
    body = {"metadata": {"labels": {zone_label: zone}}}
    return _kube(api).request("PATCH", f"/api/v1/nodes/{name}", body, STRATEGIC)


def delete_node(api: Api, name: str) -> None:
    try:
        _kube(api).request("DELETE", f"/api/v1/nodes/{name}")
    except ApiError as exc:
        if exc.status != 404:
            raise


def create_pod(
    api: Api,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    node: str | None = None,
    *,
    finalizers: Sequence[str] = (),
    hold: bool = False,
    annotations: Mapping[str, str] | None = None,
    service_account: str | None = None,
) -> Obj:
    """Create a Pending pod running ``example/consumer``.

    ``node`` sets ``spec.nodeName`` directly (as a DaemonSet would); use :func:`bind_pod` to
    act out the scheduler instead. ``hold`` adds :data:`HOLD_FINALIZER` so a later deletion
    leaves the pod Terminating until :func:`delete_pod`. ``service_account``: the pod's
    ServiceAccount, which tokens bound to the pod must be of.
    """
    all_finalizers = list(finalizers)
    if hold and HOLD_FINALIZER not in all_finalizers:
        all_finalizers.append(HOLD_FINALIZER)
    metadata: Obj = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if all_finalizers:
        metadata["finalizers"] = all_finalizers
    spec: Obj = {
        "containers": [{"name": "consumer", "image": CONSUMER_IMAGE}],
        "terminationGracePeriodSeconds": 30,
    }
    if node is not None:
        spec["nodeName"] = node
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    return _kube(api).request("POST", _pod_path(namespace), pod)


def bind_pod(api: Api, namespace: str, name: str, node: str) -> None:
    """Bind the pod to ``node`` through the ``binding`` subresource, as the scheduler does."""
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    _kube(api).request("POST", f"{_pod_path(namespace, name)}/binding", binding)


def read_pod(api: Api, namespace: str, name: str) -> Obj:
    return _kube(api).request("GET", _pod_path(namespace, name))


def set_pod_ready(api: Api, namespace: str, name: str, ready: bool = True) -> Obj:
    """Patch the pod's status to Running with Ready/ContainersReady ``ready``, as a kubelet would.

    The pod must be bound to a node.
    """
    kube = _kube(api)
    pod = read_pod(kube, namespace, name)
    if not (pod.get("spec") or {}).get("nodeName"):
        raise ValueError(f"pod {namespace}/{name} is not bound to a node")
    now = _now()
    flag = "True" if ready else "False"
    status = {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": _pod_ip(namespace, name),
        "podIPs": [{"ip": _pod_ip(namespace, name)}],
        "startTime": (pod.get("status") or {}).get("startTime") or now,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ],
        "containerStatuses": [
            {
                "name": "consumer",
                "image": CONSUMER_IMAGE,
                "imageID": "",
                "ready": ready,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
        ],
    }
    return kube.request("PATCH", f"{_pod_path(namespace, name)}/status", {"status": status}, STRATEGIC)


def pod_name(pod: Obj) -> str:
    """The name of a pod the API returned."""
    name = (pod.get("metadata") or {}).get("name")
    if not name:
        raise ValueError("the API returned a pod without a name")
    return str(name)


def pod_node(pod: Obj) -> str:
    """The node a bound pod runs on."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        raise ValueError(f"pod {pod_name(pod)} is not bound to a node")
    return str(node)


def start_pods(
    api: Api,
    namespace: str,
    prefix: str,
    count: int,
    labels: Mapping[str, str],
    nodes: Sequence[str],
    *,
    hold: bool = False,
    ready: bool = True,
    first: int = 0,
    service_account: str | None = None,
) -> list[Obj]:
    """Create ``prefix-{first}`` … ``prefix-{first+count-1}``, bind them round-robin over
    ``nodes`` and flip them to Running (Ready unless ``ready=False``). Returns the final pods."""
    if not nodes:
        raise ValueError("start_pods needs at least one node")
    kube = _kube(api)
    pods = []
    for i in range(first, first + count):
        name = f"{prefix}-{i}"
        create_pod(kube, namespace, name, labels, hold=hold, service_account=service_account)
        bind_pod(kube, namespace, name, nodes[i % len(nodes)])
        pods.append(set_pod_ready(kube, namespace, name, ready))
    return pods


def mark_terminating(api: Api, namespace: str, name: str, grace_period_seconds: int = 30) -> Obj:
    """Delete the pod the way ``kubectl delete`` does, leaving it Terminating.

    :data:`HOLD_FINALIZER` is added first when missing, so the pod keeps its
    ``deletionTimestamp`` whether or not it is bound. Finish with :func:`delete_pod`.
    """
    kube = _kube(api)
    pod = read_pod(kube, namespace, name)
    finalizers = list((pod.get("metadata") or {}).get("finalizers") or [])
    if HOLD_FINALIZER not in finalizers:
        # A JSON patch with a test on resourceVersion would be stricter; the finalizer list
        # is only ever changed by these helpers.
        body = {"metadata": {"finalizers": [*finalizers, HOLD_FINALIZER]}}
        kube.request("PATCH", _pod_path(namespace, name), body, STRATEGIC)
    kube.request("DELETE", f"{_pod_path(namespace, name)}?gracePeriodSeconds={grace_period_seconds}")
    return read_pod(kube, namespace, name)


def delete_pod(api: Api, namespace: str, name: str, *, wait: bool = True, timeout: float = 60.0) -> None:
    """Remove the pod for good: drop its finalizers and delete it with grace period 0.

    With ``wait`` the call returns once the pod is gone. A missing pod is not an error.
    """
    kube = _kube(api)
    path = _pod_path(namespace, name)
    try:
        # Strategic merge patch: null removes the whole list.
        kube.request("PATCH", path, {"metadata": {"finalizers": None}}, STRATEGIC)
        kube.request("DELETE", f"{path}?gracePeriodSeconds=0")
    except ApiError as exc:
        if exc.status != 404:
            raise
        return
    if not wait:
        return
    what = f"pod {namespace}/{name} to go after a forced delete"
    wait_for(what, lambda: kube.absent(path), timeout, 0.1, TimeoutError)
