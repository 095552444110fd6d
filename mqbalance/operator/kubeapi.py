"""Every Kubernetes API call the operator makes (besides kopf's own watches and Events).

The official synchronous client runs in a small thread pool: it understands every
kubeconfig and in-cluster credential kind, and a rebalance makes one or two calls,
so the thread hop costs microseconds against a millisecond round trip. Requests and
responses are plain JSON dicts through the client's low-level ``call_api``: no model
classes to convert, and the body we send is exactly the body we built.

Concurrency is optimistic: the ConfigMap is replaced with the resourceVersion we
last read, and a 409 raises :class:`Conflict` so the caller re-reads and
reconciles again from the fresh state (a create that finds the object already
there is the same thing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from mqbalance.document import CONFIGMAP_KEY, AssignmentDocument, DocumentError, configmap_name

GROUP = "mqbalance.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
MANAGED_BY = ("app.kubernetes.io/managed-by", "mqbalance")
GROUP_LABEL = "mqbalance.io/group"
GENERATION_ANNOTATION = "mqbalance.io/generation"
REQUEST_TIMEOUT = 30.0

T = TypeVar("T")


class ApiError(RuntimeError):
    """A Kubernetes API call failed; ``status`` is the HTTP status (0 when no answer came)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


class Conflict(ApiError):
    """The object changed since we read it (409): re-read and reconcile again."""


@dataclass
class Published:
    """The ConfigMap as last read or written."""

    document: AssignmentDocument | None
    resource_version: str | None
    """None when the ConfigMap does not exist."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    problem: str | None = None
    """Why the existing document could not be read (it is then treated as absent)."""


def load_client(kubeconfig: str | None = None, pool_size: int = 8) -> client.ApiClient:
    """In-cluster credentials when running in a pod (and no kubeconfig is named), else the kubeconfig."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


class KubeApi:
    def __init__(self, api_client: client.ApiClient, workers: int = 8) -> None:
        self.client = api_client
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kubeapi")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()  # type: ignore[no-untyped-call]

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """One blocking call; the decoded JSON answer, or ApiError / Conflict."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, serialized, _ = self.client.param_serialize(
            method=method, resource_path=path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            response = self.client.call_api(
                method, url, header_params=headers, body=serialized, _request_timeout=REQUEST_TIMEOUT
            )
            response.read()  # type: ignore[no-untyped-call]
        except ApiException as e:
            raise _error(e.status or 0, e.body or e.reason or "") from None
        except Exception as e:  # urllib3 errors: the server did not answer
            raise ApiError(0, f"{method} {path}: {e}") from None
        if not 200 <= response.status < 300:
            raise _error(response.status, response.data)
        data = json.loads(response.data or b"{}")
        return data if isinstance(data, dict) else {}

    def open_stream(self, path: str, read_timeout: float) -> Any:
        """A GET whose answer is read as it arrives (a watch): the urllib3 response, iterable by line."""
        method, url, headers, _, _ = self.client.param_serialize(
            method="GET",
            resource_path=path,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            response = self.client.call_api(
                method, url, header_params=headers, _request_timeout=(REQUEST_TIMEOUT, read_timeout)
            )
        except ApiException as e:
            raise _error(e.status or 0, e.body or e.reason or "") from None
        except Exception as e:
            raise ApiError(0, f"GET {path}: {e}") from None
        if not 200 <= response.status < 300:
            data = response.read()  # type: ignore[no-untyped-call]
            raise _error(response.status, data)
        return response.response

    # -- assignment ConfigMaps ---------------------------------------------------------------

    async def read_published(self, namespace: str, group: str) -> Published:
        return await self._run(lambda: self._read_published(namespace, group))

    def _read_published(self, namespace: str, group: str) -> Published:
        path = f"/api/v1/namespaces/{_q(namespace)}/configmaps/{_q(configmap_name(group))}"
        try:
            obj = self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return Published(None, None)
            raise
        return published_from(obj)

    async def publish(
        self, namespace: str, owner: Mapping[str, Any], document: AssignmentDocument, current: Published
    ) -> Published:
        """Create or replace the group's ConfigMap; Conflict when it changed since ``current`` was read."""
        return await self._run(lambda: self._publish(namespace, owner, document, current))

    def _publish(
        self, namespace: str, owner: Mapping[str, Any], document: AssignmentDocument, current: Published
    ) -> Published:
        group = owner["metadata"]["name"]
        body = configmap_body(namespace, owner, document, current)
        base = f"/api/v1/namespaces/{_q(namespace)}/configmaps"
        try:
            if current.resource_version is None:
                obj = self.request("POST", base, body)
            else:
                obj = self.request("PUT", f"{base}/{_q(configmap_name(group))}", body)
        except ApiError as e:
            if e.status == 409:  # AlreadyExists on create, or a stale resourceVersion on replace
                raise Conflict(409, f"ConfigMap {configmap_name(group)} changed meanwhile") from None
            raise
        meta = obj.get("metadata") or {}
        return Published(
            document,
            meta.get("resourceVersion"),
            dict(meta.get("labels") or {}),
            dict(meta.get("annotations") or {}),
        )

    # -- status ------------------------------------------------------------------------------

    async def patch_status(self, namespace: str, plural: str, name: str, status: Mapping[str, Any]) -> None:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{_q(namespace)}/{plural}/{_q(name)}/status"
        body = {"status": dict(status)}
        await self._run(lambda: self.request("PATCH", path, body, "application/merge-patch+json"))


def published_from(obj: Mapping[str, Any] | None) -> Published:
    """A ConfigMap as read (from a GET or the watch cache); None is one that does not exist."""
    if obj is None:
        return Published(None, None)
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    published = Published(
        None,
        meta.get("resourceVersion"),
        dict(meta.get("labels") or {}),
        dict(meta.get("annotations") or {}),
    )
    text = (obj.get("data") or {}).get(CONFIGMAP_KEY)
    if text is None:
        published.problem = f"ConfigMap {name} has no key {CONFIGMAP_KEY}"
        return published
    try:
        published.document = AssignmentDocument.decode(text)
    except DocumentError as e:
        published.problem = f"ConfigMap {name}: {e}"
    return published


def configmap_body(
    namespace: str, owner: Mapping[str, Any], document: AssignmentDocument, current: Published
) -> dict[str, Any]:
    """The ConfigMap for ``document``, owned by the ConsumerGroup; foreign labels and annotations are kept."""
    meta = owner["metadata"]
    labels = {**current.labels, MANAGED_BY[0]: MANAGED_BY[1], GROUP_LABEL: meta["name"]}
    annotations = {**current.annotations, GENERATION_ANNOTATION: str(document.generation)}
    metadata: dict[str, Any] = {
        "name": configmap_name(meta["name"]),
        "namespace": namespace,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": "ConsumerGroup",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if current.resource_version is not None:
        metadata["resourceVersion"] = current.resource_version
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {CONFIGMAP_KEY: document.encode()},
    }


def _error(status: int, data: Any) -> ApiError:
    message = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(message).get("message", message)
    return Conflict(status, message) if status == 409 else ApiError(status, message)


def _q(segment: str) -> str:
    return quote(segment, safe="")
