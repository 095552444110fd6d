"""A small asyncio Kubernetes API client: just enough to list and watch.

Why not the ``kubernetes`` client: its sync watch would tie up a thread per stream,
and cancelling a blocked read on shutdown is awkward. Why not hand-parse kubeconfig:
the ``kubernetes.config`` loaders already resolve contexts, tokens, exec plugins,
client certificates and the in-cluster service account (with token rotation). So
those loaders only fill a ``Configuration``; every request goes through aiohttp,
which the sidecar already serves with.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp


class KubeApiError(Exception):
    """A non-success answer from the API server."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"API server answered {status}: {message}")
        self.status = status


@dataclass
class KubeClient:
    """Requests to one API server with one identity."""

    host: str
    session: aiohttp.ClientSession
    _config: Any = None
    """The kubernetes ``Configuration``, consulted per request so rotated tokens are picked up."""

    @classmethod
    async def connect(cls, kubeconfig: Path | None = None) -> KubeClient:
        """From the in-cluster service account when ``kubeconfig`` is None, else that file."""
        from kubernetes import config as kconfig
        from kubernetes.client import Configuration

        cfg = Configuration()
        if kubeconfig is None:
            kconfig.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            kconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
        ssl_ctx: ssl.SSLContext | bool
        if cfg.host.startswith("https"):
            if cfg.verify_ssl:
                ssl_ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            else:
                ssl_ctx = ssl.create_default_context()
                ssl_ctx.check_hostname = False
                ssl_ctx.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                ssl_ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        else:
            ssl_ctx = False
        # No total timeout: watches are long-lived; a stalled connection is caught by
        # sock_read (the server sends a bookmark or closes the watch before then).
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10, sock_read=330)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_ctx), timeout=timeout)
        return cls(host=cfg.host.rstrip("/"), session=session, _config=cfg)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._config is not None:
            auth = self._config.auth_settings().get("BearerToken")
            if auth and auth.get("value"):
                headers["Authorization"] = auth["value"]
        return headers

    async def get(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        async with self.session.get(self.host + path, params=params, headers=self._headers()) as resp:
            if resp.status >= 300:
                raise KubeApiError(resp.status, await _error_text(resp))
            data: dict[str, Any] = await resp.json()
            return data

    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Watch events, one JSON object per line, until the server ends the stream."""
        query = {**params, "watch": "1"}
        async with self.session.get(self.host + path, params=query, headers=self._headers()) as resp:
            if resp.status >= 300:
                raise KubeApiError(resp.status, await _error_text(resp))
            # Lines can exceed aiohttp's default read chunk for large objects, so
            # split on newlines ourselves rather than relying on readline limits.
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line, buffer = buffer[:end], buffer[end + 1 :]
                    if line.strip():
                        yield json.loads(line)

    async def close(self) -> None:
        await self.session.close()


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    text = await resp.text()
    try:
        return str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        return text[:500]
