"""The one Kubernetes API client of the operator and the sidecar: asynchronous, on aiohttp.

The ``kubernetes`` package's loaders resolve kubeconfig contexts, tokens, exec plugins,
client certificates and the in-cluster service account (with token rotation); they only
fill a ``Configuration`` here. Every request goes through one aiohttp session, with plain
JSON in and out: no model classes, and the body sent is exactly the body built. A watch
holds a connection of its own for its whole life; other requests share a bounded number,
so a burst of writes (a cold start of thousands of groups) queues instead of opening
thousands of connections.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp

REQUEST_TIMEOUT = 30.0
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """The API server answered with an error (``status`` 0: it did not answer at all)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.reason = reason
        """The Status object's ``reason``: ``NotFound``, ``AlreadyExists``, ``Conflict``, ``Expired``..."""


class Conflict(ApiError):
    """409: the object changed since it was read, or already exists."""


class Gone(ApiError):
    """410: the resourceVersion to list or watch from is too old."""


def error_for(status: int, message: str, reason: str = "") -> ApiError:
    kind = Conflict if status == 409 else Gone if status == 410 else ApiError
    return kind(status, message, reason)


class KubeClient:
    """Requests to one API server with one identity; create it with :meth:`connect`."""

    def __init__(
        self, host: str, session: aiohttp.ClientSession, configuration: Any = None, requests: int = 32
    ) -> None:
        self.host = host
        self._session = session
        self._configuration = configuration
        self._slots = asyncio.Semaphore(requests)

    @classmethod
    async def connect(
        cls, kubeconfig: str | Path | None = None, *, requests: int = 32, context: str | None = None
    ) -> KubeClient:
        """In-cluster credentials in a pod when no kubeconfig is named, else the kubeconfig
        (``kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``; its ``context``, default the
        current one). ``requests``: how many requests (not watches) may be in flight at once."""
        from kubernetes import config as kconfig
        from kubernetes.client import Configuration

        configuration = Configuration()
        if (
            kubeconfig is None
            and os.environ.get("KUBERNETES_SERVICE_HOST")
            and not os.environ.get("KUBECONFIG")
            and context is None
        ):
            kconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            kconfig.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig) if kubeconfig else None,
                context=context,
                client_configuration=configuration,
            )
        tls: ssl.SSLContext | bool = False
        if configuration.host.startswith("https"):
            if configuration.verify_ssl:
                tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            else:
                tls = ssl.create_default_context()
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            if configuration.cert_file:
                tls.load_cert_chain(configuration.cert_file, configuration.key_file)
        # No total timeout on the session: watches are long-lived. Requests set their own.
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=tls, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        return cls(configuration.host.rstrip("/"), session, configuration, requests)

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        if self._configuration is None:
            return headers
        # Read per request: the in-cluster loader rotates the token file's token.
        auth = self._configuration.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers["Authorization"] = auth["value"]
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = REQUEST_TIMEOUT,
    ) -> dict[str, Any]:
        """One call; the decoded JSON answer, else :class:`ApiError` (or a subclass)."""
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = self._headers(content_type if data is not None else None)
        async with self._slots:
            try:
                async with self._session.request(
                    method,
                    self.host + path,
                    params=params,
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                ) as resp:
                    text = await resp.text()
                    if resp.status >= 300:
                        raise _error(resp.status, text)
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise ApiError(0, f"{method} {path}: {e or type(e).__name__}") from None
        answer = json.loads(text) if text else {}
        return answer if isinstance(answer, dict) else {}

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("PUT", path, body=body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.request("PATCH", path, body=operations, content_type=JSON_PATCH)

    async def delete(self, path: str) -> dict[str, Any]:
        return await self.request("DELETE", path)

    async def watch(
        self, path: str, params: Mapping[str, str], read_timeout: float
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events (``{"type", "object"}``), one per line, until the server ends the stream.

        An ERROR event raises its status (410 as :class:`Gone`). ``read_timeout`` catches a
        stalled connection: the server sends a bookmark or ends the watch before then.
        """
        try:
            async with self._session.get(
                self.host + path,
                params={**params, "watch": "true"},
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout),
            ) as resp:
                if resp.status >= 300:
                    raise _error(resp.status, await resp.text())
                # Lines can outgrow aiohttp's readline buffer for large objects: split ourselves.
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line, buffer = buffer[:end], buffer[end + 1 :]
                        if line.strip():
                            event = json.loads(line)
                            if event.get("type") == "ERROR":
                                status = event.get("object") or {}
                                raise error_for(
                                    int(status.get("code") or 500),
                                    str(status.get("message") or status),
                                    str(status.get("reason") or ""),
                                )
                            yield event
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ApiError(0, f"watch {path}: {e or type(e).__name__}") from None

    async def close(self) -> None:
        await self._session.close()


def kubeconfig_namespace(kubeconfig: str | Path | None = None, context: str | None = None) -> str:
    """The namespace kubectl would use: the kubeconfig context's (``context``, default the current
    one), else ``default``."""
    from kubernetes import config as kconfig

    try:
        contexts, current = kconfig.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig) if kubeconfig else None
        )
    except (kconfig.ConfigException, OSError):
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _error(status: int, text: str) -> ApiError:
    message, reason = text[:1000], ""
    try:
        data = json.loads(text)
    except ValueError:
        pass
    else:
        if isinstance(data, dict):
            message = str(data.get("message") or message)
            reason = str(data.get("reason") or "")
    return error_for(status, message, reason)
