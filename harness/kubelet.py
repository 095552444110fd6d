"""Act out what kubelets and the scheduler would do, against a real API server.

The local control plane (:mod:`harness.cluster`) runs no kubelet and no scheduler.
These helpers create Nodes with zone labels, create Pods, bind them with the ``binding``
subresource and patch their status to Running/Ready, so membership looks as it would in a
real cluster. They use the synchronous ``kubernetes`` client and take an ``ApiClient``.

Deletion without a kubelet: a *bound* pod deleted with a grace period keeps its
``deletionTimestamp`` forever (the kubelet normally finishes the deletion), so
:func:`delete_pod` deletes with ``grace_period_seconds=0``. Unbound pods disappear at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.polling import wait_for

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


def _core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def _node_conditions(ready: bool) -> list[dict[str, Any]]:
    now = _now()
    return [
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "acted out by harness.kubelet",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
    ]


def create_node(
    api: client.ApiClient,
    name: str,
    zone: str | None,
    zone_label: str = ZONE_LABEL,
    *,
    labels: Mapping[str, str] | None = None,
    ready: bool = True,
) -> client.V1Node:
    """Create a Node labelled with its zone (no label when ``zone`` is None) and mark it Ready."""
    all_labels = {HOSTNAME_LABEL: name, **(labels or {})}
    if zone is not None:
        all_labels[zone_label] = zone
    node = client.V1Node(
        api_version="v1",
        kind="Node",
        metadata=client.V1ObjectMeta(name=name, labels=all_labels),
    )
    _core(api).create_node(node)
    return set_node_ready(api, name, ready)


def set_node_ready(api: client.ApiClient, name: str, ready: bool = True) -> client.V1Node:
    """Patch the Node's Ready condition, as a kubelet's status update would."""
    body = {"status": {"conditions": _node_conditions(ready)}}
    return _core(api).patch_node_status(name, body)


def set_node_zone(
    api: client.ApiClient,
    name: str,
    zone: str | None,
    zone_label: str = ZONE_LABEL,
) -> client.V1Node:
    """Set (or with ``zone=None`` remove) the Node's zone label."""
    body = {"metadata": {"labels": {zone_label: zone}}}
    return _core(api).patch_node(name, body)


def delete_node(api: client.ApiClient, name: str) -> None:
    try:
        _core(api).delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def create_pod(
    api: client.ApiClient,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    node: str | None = None,
    *,
    finalizers: Sequence[str] = (),
    hold: bool = False,
    annotations: Mapping[str, str] | None = None,
) -> client.V1Pod:
    """Create a Pending pod running ``example/consumer``.

    ``node`` sets ``spec.nodeName`` directly (as a DaemonSet would); use :func:`bind_pod` to
    act out the scheduler instead. ``hold`` adds :data:`HOLD_FINALIZER` so a later deletion
    leaves the pod Terminating until :func:`delete_pod`.
    """
    all_finalizers = list(finalizers)
    if hold and HOLD_FINALIZER not in all_finalizers:
        all_finalizers.append(HOLD_FINALIZER)
    pod = client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=namespace,
            labels=dict(labels),
            annotations=dict(annotations) if annotations else None,
            finalizers=all_finalizers or None,
        ),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="consumer", image=CONSUMER_IMAGE)],
            node_name=node,
            termination_grace_period_seconds=30,
        ),
    )
    return _core(api).create_namespaced_pod(namespace, pod)


def bind_pod(api: client.ApiClient, namespace: str, name: str, node: str) -> None:
    """Bind the pod to ``node`` through the ``binding`` subresource, as the scheduler does."""
    binding = client.V1Binding(
        api_version="v1",
        kind="Binding",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    # The server answers with a Status, not a Binding: skip the client's decoding.
    response: Any = _core(api).create_namespaced_pod_binding(name, namespace, binding, _preload_content=False)
    response.release_conn()


def set_pod_ready(api: client.ApiClient, namespace: str, name: str, ready: bool = True) -> client.V1Pod:
    """Patch the pod's status to Running with Ready/ContainersReady ``ready``, as a kubelet would.

    The pod must be bound to a node.
    """
    core = _core(api)
    pod = core.read_namespaced_pod(name, namespace)
    if not pod.spec or not pod.spec.node_name:
        raise ValueError(f"pod {namespace}/{name} is not bound to a node")
    now = _now()
    flag = "True" if ready else "False"
    status = {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": _pod_ip(namespace, name),
        "podIPs": [{"ip": _pod_ip(namespace, name)}],
        "startTime": (
            pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ")
            if pod.status and pod.status.start_time
            else now
        ),
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
    return core.patch_namespaced_pod_status(name, namespace, {"status": status})


def pod_name(pod: client.V1Pod) -> str:
    """The name of a pod the API returned (the client types every field as optional)."""
    if pod.metadata is None or pod.metadata.name is None:
        raise ValueError("the API returned a pod without a name")
    return str(pod.metadata.name)


def pod_node(pod: client.V1Pod) -> str:
    """The node a bound pod runs on."""
    if pod.spec is None or pod.spec.node_name is None:
        raise ValueError(f"pod {pod_name(pod)} is not bound to a node")
    return str(pod.spec.node_name)


def start_pods(
    api: client.ApiClient,
    namespace: str,
    prefix: str,
    count: int,
    labels: Mapping[str, str],
    nodes: Sequence[str],
    *,
    hold: bool = False,
    ready: bool = True,
    first: int = 0,
) -> list[client.V1Pod]:
    """Create ``prefix-{first}`` … ``prefix-{first+count-1}``, bind them round-robin over
    ``nodes`` and flip them to Running (Ready unless ``ready=False``). Returns the final pods."""
    if not nodes:
        raise ValueError("start_pods needs at least one node")
    pods = []
    for i in range(first, first + count):
        name = f"{prefix}-{i}"
        create_pod(api, namespace, name, labels, hold=hold)
        bind_pod(api, namespace, name, nodes[i % len(nodes)])
        pods.append(set_pod_ready(api, namespace, name, ready))
    return pods


def mark_terminating(
    api: client.ApiClient, namespace: str, name: str, grace_period_seconds: int = 30
) -> client.V1Pod:
    """Delete the pod the way ``kubectl delete`` does, leaving it Terminating.

    :data:`HOLD_FINALIZER` is added first when missing, so the pod keeps its
    ``deletionTimestamp`` whether or not it is bound. Finish with :func:`delete_pod`.
    """
    core = _core(api)
    pod = core.read_namespaced_pod(name, namespace)
    finalizers = list(pod.metadata.finalizers or []) if pod.metadata else []
    if HOLD_FINALIZER not in finalizers:
        # A JSON patch with a test on resourceVersion would be stricter; the finalizer list
        # is only ever changed by these helpers.
        core.patch_namespaced_pod(
            name, namespace, {"metadata": {"finalizers": [*finalizers, HOLD_FINALIZER]}}
        )
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_period_seconds)
    return core.read_namespaced_pod(name, namespace)


def delete_pod(
    api: client.ApiClient, namespace: str, name: str, *, wait: bool = True, timeout: float = 60.0
) -> None:
    """Remove the pod for good: drop its finalizers and delete it with grace period 0.

    With ``wait`` the call returns once the pod is gone. A missing pod is not an error.
    """
    core = _core(api)
    try:
        # Strategic merge patch: null removes the whole list.
        core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return
    if not wait:
        return

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_for(f"pod {namespace}/{name} to go after a forced delete", gone, timeout, 0.1, TimeoutError)
