"""The one source of the sidecar container, and the JSON patch that adds it to a pod.

Standard library only. The webhook patches pods with :func:`sidecar_container`; the chart's helper
(``mqbalance.sidecar.container``), ``examples/consumer-deployment.yaml`` and docs/deploy.md render the
same container, and ``tests/unit/test_injector_spec.py`` (with ``helm template``) checks that they agree.
``hack/render-sidecar.py`` rewrites the example and the docs from here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mqbalance.buildinfo import version
from mqbalance.contract.names import INJECTION_LABEL, SIDECAR_CONTAINER, SIDECAR_GROUP_ANNOTATION

CONTAINER_NAME = SIDECAR_CONTAINER
NAMESPACE_LABEL, NAMESPACE_LABEL_VALUE = INJECTION_LABEL
"""The label that turns injection on, on the namespace and on each pod: ``mqbalance.io/sidecar-injection:
enabled`` (the webhook's namespaceSelector and objectSelector)."""
GROUP_ANNOTATION = SIDECAR_GROUP_ANNOTATION
"""The pod annotation naming the ConsumerGroup(s) the sidecar serves (comma-separate several)."""
ZONE_ANNOTATION = "mqbalance.io/sidecar-zone"
"""Optional pod annotation: the pod's zone, for the producer's machine-room selector."""
POD_LABEL = "mqbalance.io/sidecar"
"""Label on pods with the sidecar (scraped by the chart's optional PodMonitor)."""
TOKEN_VOLUME = "mqbalance-sidecar-token"
TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_EXPIRATION_SECONDS = 3600
"""Lifetime of the sidecar's projected token; the kubelet renews it at 80% of that (the client reads the
file at every request)."""
GRACE_MARGIN_SECONDS = 15
"""How much longer than the drain timeout a pod's terminationGracePeriodSeconds must be: the drain
ends, then the sidecar and the application stop."""
METRICS_PORT_NAME = "mqb-metrics"
METRICS_HOST = "$(POD_IP),127.0.0.1"
"""Where the sidecar's metrics listen: the pod's IP, which Prometheus scrapes and the kubelet probes, and
loopback, which ``kubectl port-forward`` and ``kubectl exec`` reach; not every address of the pod's network
namespace (the kubelet expands ``$(POD_IP)`` from the env var defined before it)."""

# A ConsumerGroup resource name (the ConfigMap "<group>-assignment" must also be a valid name).
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_MAX = 253 - len("-assignment")


def default_image() -> str:
    return f"mqbalance/mqbalance:{version()}"


def _default_resources() -> dict[str, Any]:
    return {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}}


def _default_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


@dataclass(frozen=True)
class SidecarSettings:
    """The chart's ``sidecar.*`` values that shape the container; the defaults are the chart's. The
    fields are named as the chart's keys, so the chart passes them as one JSON object."""

    image: str = field(default_factory=default_image)
    imagePullPolicy: str = "IfNotPresent"
    port: int = 8081
    metricsPort: int = 9091
    drainTimeoutSeconds: int = 45
    faultTable: str = "5x"
    faultTolerance: bool = False
    watchTopics: bool = True
    resources: Mapping[str, Any] = field(default_factory=_default_resources)
    securityContext: Mapping[str, Any] = field(default_factory=_default_security_context)

    @classmethod
    def from_json(cls, text: str) -> SidecarSettings:
        """Settings from a JSON object with the chart's keys; unknown keys are an error."""
        data = json.loads(text) if text.strip() else {}
        if not isinstance(data, dict):
            raise ValueError("the sidecar settings must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown sidecar settings {unknown}; known: {sorted(known)}")
        settings = cls(**data)
        if settings.drainTimeoutSeconds < 0:
            raise ValueError("drainTimeoutSeconds must not be negative")
        return settings

    @property
    def min_grace_period(self) -> int:
        """The shortest terminationGracePeriodSeconds a pod with this sidecar may have."""
        return self.drainTimeoutSeconds + GRACE_MARGIN_SECONDS


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def sidecar_container(
    settings: SidecarSettings, group: str, zone: str | None = None, own_token: bool = False
) -> dict[str, Any]:
    """The sidecar container for a pod of ``group`` (comma-separated for several).

    With ``own_token`` the container mounts :func:`token_volume` where in-cluster credentials are read
    from: a token of the pod's ServiceAccount bound to the pod, whether or not the pod mounts one for
    its other containers."""
    env: list[dict[str, Any]] = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_UID", "metadata.uid"),
        _field_env("POD_IP", "status.podIP"),
        {"name": "MQBALANCE_GROUP", "value": group},
        {"name": "MQBALANCE_SIDECAR_PORT", "value": str(settings.port)},
        {"name": "MQBALANCE_METRICS_HOST", "value": METRICS_HOST},
        {"name": "MQBALANCE_METRICS_PORT", "value": str(settings.metricsPort)},
        {"name": "MQBALANCE_FAULT_TABLE", "value": settings.faultTable},
        {"name": "MQBALANCE_FAULT_TOLERANCE", "value": "true" if settings.faultTolerance else "false"},
    ]
    if not settings.watchTopics:
        env.append({"name": "MQBALANCE_NO_TOPICS", "value": "true"})
    if zone:
        env.append({"name": "MQBALANCE_ZONE", "value": zone})

    def probe() -> dict[str, Any]:
        return {"httpGet": {"path": "/metrics", "port": METRICS_PORT_NAME}}

    drain = [
        "mqbalance",
        "drain",
        "--port",
        str(settings.port),
        "--timeout",
        str(settings.drainTimeoutSeconds),
    ]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": settings.image,
        "imagePullPolicy": settings.imagePullPolicy,
        "args": ["sidecar"],
        "env": env,
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": settings.metricsPort, "protocol": "TCP"}],
        # Alive and Ready as soon as the metrics port answers. Readiness matters: a sidecar that crashes
        # at start would otherwise let its pod turn Ready between restarts and join the group. Never on
        # /readyz (an assignment): a pod gets queues only once it is Ready.
        "livenessProbe": probe(),
        "readinessProbe": {**probe(), "periodSeconds": 2},
        # A terminating pod keeps its sidecar until its queues are handed over (spec.handover).
        "lifecycle": {"preStop": {"exec": {"command": drain}}},
        "resources": json.loads(json.dumps(settings.resources)),
        "securityContext": json.loads(json.dumps(settings.securityContext)),
    }
    if own_token:
        container["volumeMounts"] = [{"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT_PATH, "readOnly": True}]
    return container


_NAMESPACE_FIELD = {"apiVersion": "v1", "fieldPath": "metadata.namespace"}


def token_volume() -> dict[str, Any]:
    """The sidecar's credentials, mounted by the sidecar only: what the kubelet projects for a pod's
    ServiceAccount (``kube-api-access-*``), a token bound to the pod that expires and is renewed. The
    API server reads the pod's name from such a token, which is what confines each sidecar to its own
    member Lease and release acknowledgement (the chart's admission policy); a token Secret names no pod."""
    return {
        "name": TOKEN_VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": _NAMESPACE_FIELD}]}},
            ],
        },
    }


class Refused(ValueError):
    """The pod asks for a sidecar in a way that cannot be served; admission refuses it with this message."""


def parse_groups(value: str) -> str:
    """The annotation's group list, normalised ("a, b" -> "a,b"); :class:`Refused` when it names no
    group or an invalid name."""
    groups = [g.strip() for g in value.split(",")]
    if not any(groups):
        raise Refused(f"annotation {GROUP_ANNOTATION} names no ConsumerGroup")
    for group in groups:
        if not group or len(group) > _NAME_MAX or not _NAME.match(group):
            raise Refused(
                f"annotation {GROUP_ANNOTATION}: {group!r} is not a ConsumerGroup name (lower-case letters,"
                f" digits, '-' and '.', at most {_NAME_MAX} characters; comma-separate several)"
            )
    if len(set(groups)) != len(groups):
        raise Refused(f"annotation {GROUP_ANNOTATION} names a group twice: {value!r}")
    return ",".join(groups)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def has_sidecar(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    return any(isinstance(c, dict) and c.get("name") == CONTAINER_NAME for c in containers)


def pod_patch(pod: Mapping[str, Any], settings: SidecarSettings) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that gives ``pod`` its sidecar; empty when the pod does not ask for
    one (no annotation) or already has it. :class:`Refused` when its annotation is unusable, or missing
    from a pod labelled for injection."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    value = annotations.get(GROUP_ANNOTATION)
    if value is None and (metadata.get("labels") or {}).get(NAMESPACE_LABEL) == NAMESPACE_LABEL_VALUE:
        raise Refused(
            f"the pod is labelled {NAMESPACE_LABEL}={NAMESPACE_LABEL_VALUE} but has no annotation "
            f"{GROUP_ANNOTATION} naming the ConsumerGroup its sidecar serves"
        )
    if value is None or has_sidecar(pod):
        return []
    group = parse_groups(str(value))
    zone = str(annotations.get(ZONE_ANNOTATION) or "").strip() or None
    spec = pod.get("spec") or {}
    ops: list[dict[str, Any]] = []
    container = sidecar_container(settings, group, zone, own_token=True)
    if spec.get("containers"):
        ops.append({"op": "add", "path": "/spec/containers/-", "value": container})
    else:
        ops.append({"op": "add", "path": "/spec/containers", "value": [container]})
    if any(v.get("name") == TOKEN_VOLUME for v in spec.get("volumes") or []):
        raise Refused(f"the pod already has a volume named {TOKEN_VOLUME}")
    if spec.get("volumes"):
        ops.append({"op": "add", "path": "/spec/volumes/-", "value": token_volume()})
    else:
        ops.append({"op": "add", "path": "/spec/volumes", "value": [token_volume()]})
    grace = spec.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or grace < settings.min_grace_period:
        ops.append(
            {"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": settings.min_grace_period}
        )
    labels = metadata.get("labels")
    if not labels:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {POD_LABEL: "true"}})
    elif labels.get(POD_LABEL) != "true":
        ops.append({"op": "add", "path": f"/metadata/labels/{_escape(POD_LABEL)}", "value": "true"})
    return ops
