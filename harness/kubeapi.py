"""A blocking REST helper for benchmarks and tests that act out the world (pods, nodes, floors).

The product talks to the API server through ``mqbalance.kube`` only; this is the harness's
kubectl in Python: the ``kubernetes`` package's ApiClient with plain JSON bodies, usable from
threads.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from harness.polling import scaled

REQUEST_TIMEOUT = 30.0
"""One call's allowance on an unloaded machine; each call scales it (harness.polling.scaled)."""


class ApiError(RuntimeError):
    """A call failed; ``status`` is the HTTP status (0 when no answer came)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


def load_client(kubeconfig: str, pool_size: int = 8) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


class KubeApi:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.client = api_client

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """One blocking call; the decoded JSON answer, or ApiError."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, serialized, _ = self.client.param_serialize(
            method=method, resource_path=path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            response = self.client.call_api(
                method, url, header_params=headers, body=serialized, _request_timeout=scaled(REQUEST_TIMEOUT)
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


def _error(status: int, data: Any) -> ApiError:
    message = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(message).get("message", message)
    return ApiError(status, message)
