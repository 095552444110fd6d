"""The sidecar's one write for the handover: this pod's release acknowledgements.

``POST /v1/release`` records here what the application let go of; the operator reads the
releases ConfigMap and hands the queues over.
"""

from __future__ import annotations

from mqbalance.contract import Ack, releases_configmap_name
from mqbalance.kube import KubeClient


class AckRecorder:
    """Writes this pod's release acknowledgements into its groups' releases ConfigMaps."""

    def __init__(self, kube: KubeClient, namespace: str, pod: str) -> None:
        self._kube, self._namespace, self._pod = kube, namespace, pod

    async def record(self, group: str, ack: Ack) -> None:
        """One key, the pod's name: the Role may grant patch on that one ConfigMap (resourceNames)."""
        path = f"/api/v1/namespaces/{self._namespace}/configmaps/{releases_configmap_name(group)}"
        await self._kube.merge_patch(path, {"data": {self._pod: ack.encode()}})
