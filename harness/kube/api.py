"""The harness's one blocking Kubernetes client: plain JSON bodies, usable from threads.

The product talks to the API server through ``mqbalance.kube`` only; this is the harness's
kubectl in Python, for the tests, the benchmarks and the demo that act out the world (pods, nodes,
floors) and read what the operator wrote. It rides on the ``kubernetes`` package's ``ApiClient``
(its kubeconfig loader, TLS and connection pool) and nothing else of it: no typed models.
``LocalCluster.request`` and ``harness.kube.kubelet`` go through it.

- ``call``: one call, ``(status, decoded JSON or text)`` whatever the status;
- ``request``: one call that must succeed, the decoded JSON answer or :class:`ApiError`.

Where no answer came (refused, reset, timed out) both raise :class:`Unreachable`, an
``OSError`` as a socket's own errors are.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from harness.polling import scaled

REQUEST_TIMEOUT = 30.0
"""One call's allowance on an unloaded machine; each call scales it (harness.polling.scaled)."""
RETRIED = frozenset({429, 504})
"""Statuses of a call the API server did not carry out in time: :meth:`KubeApi.request` repeats it."""
RETRIES = 3
RETRY_DELAY = 1.0


class ApiError(RuntimeError):
    """A call failed; ``status`` is the HTTP status (0 when no answer came)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


class Unreachable(ApiError, ConnectionError):
    """No answer came: the server refused, reset or did not answer in time."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


__all__ = ["ApiClient", "ApiError", "KubeApi", "Unreachable", "load_client"]


def load_client(kubeconfig: str | Path, pool_size: int = 8) -> ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool_size
    return ApiClient(configuration)


class KubeApi:
    def __init__(self, api_client: ApiClient) -> None:
        self.client = api_client

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Path, pool_size: int = 8) -> KubeApi:
        return cls(load_client(kubeconfig, pool_size))

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> tuple[int, Any]:
        """One blocking call: the status and the decoded JSON answer (the text where it is no JSON).

        ``body`` is sent as JSON; a PATCH is a JSON merge patch unless ``content_type`` says
        otherwise. ``timeout`` is scaled for the machine's load.
        """
        headers = {"Accept": "application/json"}
        if body is not None:
            default = "application/merge-patch+json" if method == "PATCH" else "application/json"
            headers["Content-Type"] = content_type or default
        method, url, headers, serialized, _ = self.client.param_serialize(
            method=method, resource_path=path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            response = self.client.call_api(
                method, url, header_params=headers, body=serialized, _request_timeout=scaled(timeout)
            )
            response.read()  # type: ignore[no-untyped-call]
            status, raw = response.status, response.data
        except ApiException as e:
            if not e.status:
                raise Unreachable(f"{method} {path}: {e.reason}") from None
            status, raw = e.status, e.body
        except Exception as e:  # urllib3 errors: the server did not answer
            raise Unreachable(f"{method} {path}: {e}") from None
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def absent(self, path: str) -> bool:
        """Whether the object at ``path`` is gone (404); False while it is there, ApiError otherwise."""
        status, answer = self.call("GET", path)
        if status not in (200, 404):
            raise _error(status, answer)
        return status == 404

    def request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> dict[str, Any]:
        """One blocking call that must succeed; the decoded JSON answer, or ApiError.

        A read or a patch the API server gave up on (504: its own 60 s request timeout ran out on a
        starved machine; 429: too many requests) is sent again, as a kubelet or kubectl would: both
        are idempotent. Other calls are not repeated (a create may have happened)."""
        attempts = RETRIES + 1 if method in ("GET", "PATCH") else 1
        for attempt in range(attempts):
            status, answer = self.call(method, path, body, content_type=content_type)
            if status not in RETRIED or attempt == attempts - 1:
                break
            time.sleep(RETRY_DELAY * (attempt + 1))
        if not 200 <= status < 300:
            raise _error(status, answer)
        return answer if isinstance(answer, dict) else {}


def _error(status: int, answer: Any) -> ApiError:
    message = answer if isinstance(answer, str) else json.dumps(answer)
    with contextlib.suppress(AttributeError):
        message = answer.get("message", message)
    return ApiError(status, message)
