"""The webhook's HTTP side: ``POST /mutate`` answers an ``admission.k8s.io/v1`` AdmissionReview with the
JSON patch of :func:`mqbalance.injector.spec.pod_patch`; ``GET /healthz`` for the probes.

A request that is not an AdmissionReview of a Pod gets a 4xx JSON error
(``{"error": ..., "status": N}``, as the sidecar's API); the API server then applies the webhook's
``failurePolicy``. A pod whose annotation is unusable is refused (``allowed: false``, code 400) with
a message saying what to fix.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

from aiohttp import web

from mqbalance.injector.spec import Refused, SidecarSettings, pod_patch

log = logging.getLogger("mqbalance.injector")

API_VERSION = "admission.k8s.io/v1"
MAX_BODY = 3 * 1024 * 1024
"""An AdmissionReview of the largest pod etcd stores (1.5 MiB), as object and oldObject."""


class BadReview(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status)


def review_request(body: Any) -> dict[str, Any]:
    """The ``request`` of an AdmissionReview of a Pod; :class:`BadReview` (400) otherwise."""
    if not isinstance(body, dict):
        raise BadReview(400, "the body must be a JSON AdmissionReview object")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise BadReview(
            400,
            f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
            f"{body.get('apiVersion')!r} {body.get('kind')!r} (admissionReviewVersions must be [v1])",
        )
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview(400, "the AdmissionReview has no request with a uid")
    kind = request.get("kind") or {}
    if not isinstance(kind, dict) or kind.get("kind") != "Pod" or kind.get("group", "") != "":
        raise BadReview(400, f"this webhook mutates Pods only, not {kind!r}")
    if request.get("operation", "CREATE") == "CREATE":
        pod = request.get("object")
        if not isinstance(pod, dict):
            raise BadReview(400, "the AdmissionReview's request has no object")
        check_pod(pod)
    return request


def check_pod(pod: dict[str, Any]) -> None:
    """The fields :func:`~mqbalance.injector.spec.pod_patch` reads have a Pod's types; :class:`BadReview`
    (400) naming the first that does not. The API server sends only valid pods; anyone else who reaches
    the port gets a 400, not a 500."""
    metadata, spec = pod.get("metadata"), pod.get("spec")
    _check(metadata, dict, "object.metadata")
    _check(spec, dict, "object.spec")
    for name in ("annotations", "labels"):
        values = (metadata or {}).get(name)
        _check(values, dict, f"object.metadata.{name}")
        if any(not isinstance(v, str) for v in (values or {}).values()):
            raise BadReview(400, f"object.metadata.{name} must map names to strings")
    for name in ("containers", "initContainers", "volumes"):
        items = (spec or {}).get(name)
        _check(items, list, f"object.spec.{name}")
        if any(not isinstance(item, dict) for item in items or ()):
            raise BadReview(400, f"object.spec.{name} must be a list of objects")


def _check(value: Any, kind: type, where: str) -> None:
    if value is not None and not isinstance(value, kind):
        expected = "an object" if kind is dict else "a list"
        raise BadReview(400, f"{where} must be {expected}, got {type(value).__name__}")


def review_response(
    request: dict[str, Any], settings: SidecarSettings, accounts: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The AdmissionReview answering ``request``: allowed, with the patch when there is one, and a
    warning when the pod runs as a ServiceAccount outside ``accounts`` (those the chart gives the
    sidecar Role; none known: no warning)."""
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    if request.get("operation", "CREATE") == "CREATE":
        pod = request["object"]
        name = (pod.get("metadata") or {}).get("name") or request.get("name") or "(generated name)"
        where = f"{request.get('namespace', '')}/{name}"
        try:
            ops = pod_patch(pod, settings)
        except Refused as e:
            log.info("refused pod %s: %s", where, e)
            response = {
                "uid": request["uid"],
                "allowed": False,
                "status": {
                    "code": 400,
                    "reason": "BadRequest",
                    "message": f"mqbalance sidecar injection: {e}",
                },
            }
        else:
            if ops:
                log.info("injecting the sidecar into pod %s", where)
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
                account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
                if accounts and account not in accounts:
                    response["warnings"] = [unbound_account(account, accounts)]
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def unbound_account(account: str, accounts: frozenset[str]) -> str:
    """The warning for a pod that runs as ``account``, which has not the sidecar Role."""
    return (
        f"mqbalance sidecar: the pod runs as ServiceAccount {account!r}, which the chart does not give "
        f"the sidecar Role ({', '.join(sorted(accounts))}): its sidecar will be refused its assignment "
        f"and hold no queues. Run the pod as one of those, or add {account!r} to the chart's "
        "sidecar.serviceAccounts"
    )


SETTINGS = web.AppKey("settings", SidecarSettings)
ACCOUNTS = web.AppKey("accounts", frozenset)


async def mutate(request: web.Request) -> web.Response:
    if request.content_type != "application/json":
        return _error(415, f"expected Content-Type application/json, got {request.content_type!r}")
    try:
        body = json.loads(await request.read())
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"the AdmissionReview is larger than {MAX_BODY} bytes")
    except web.RequestPayloadError as e:  # a broken chunked or compressed encoding
        return _error(400, f"the body cannot be read: {' '.join(str(e).split())}")
    except ValueError as e:
        return _error(400, f"the body is not JSON: {e}")
    except RecursionError:
        return _error(400, "the body nests arrays or objects too deeply to decode")
    try:
        review = review_request(body)
    except BadReview as e:
        return _error(e.status, str(e))
    answer = review_response(review, request.app[SETTINGS], request.app[ACCOUNTS])
    return web.json_response(answer)


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def create_app(settings: SidecarSettings, accounts: frozenset[str] = frozenset()) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    app[ACCOUNTS] = accounts
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app
