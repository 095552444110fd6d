"""ConfigMaps as the operator publishes them, for the sidecar's tests (the process: harness.apps.sidecar)."""

from __future__ import annotations

from mqbalance.contract import CONFIGMAP_KEY, AssignmentDocument, configmap_name


def configmap_body(group: str, doc: AssignmentDocument) -> dict[str, object]:
    """The ConfigMap the operator publishes for ``doc``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap_name(group), "labels": {"app.kubernetes.io/managed-by": "mqbalance"}},
        "data": {CONFIGMAP_KEY: doc.encode()},
    }
