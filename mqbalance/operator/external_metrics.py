"""``external.metrics.k8s.io/v1beta1``: each ConsumerGroup's lag and recommended member count for
a HorizontalPodAutoscaler with ``type: External``, served through an APIService.

The API server's aggregation layer proxies
``GET /apis/external.metrics.k8s.io/v1beta1/namespaces/NS/METRIC?labelSelector=...`` here once it
has authenticated and authorized the caller (the HPA controller holds ``get`` on
``external.metrics.k8s.io`` by its bootstrap role). It calls with its front-proxy client
certificate, signed by the CA it publishes in ConfigMap ``kube-system/
extension-apiserver-authentication`` (``requestheader-client-ca-file``): this listener accepts no
other client, so nothing reaches the figures around the API server's authorization.

The figures are the ConsumerGroups' ``status.lag``, listed from the API server per request with the
HPA's selector as the label selector: any operator replica answers the same (a standby, a replica
of another shard), and the autoscaler sees what ``kubectl get consumergroups`` shows.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from mqbalance import listener
from mqbalance.contract import API_PATH, CONSUMER_GROUPS
from mqbalance.kube import ApiError, KubeClient
from mqbalance.listener import Limits, parse_hosts
from mqbalance.operator.conditions import rfc3339

logger = logging.getLogger("mqbalance.operator")

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
LAG_METRIC = "mqbalance_consumergroup_lag"
"""status.lag.total: messages stored and not yet consumed."""
RECOMMENDED_METRIC = "mqbalance_consumergroup_recommended_members"
"""status.lag.recommendedMembers: with target averageValue 1 an HPA keeps that many replicas."""
METRICS: Mapping[str, str] = {LAG_METRIC: "total", RECOMMENDED_METRIC: "recommendedMembers"}
"""Metric name -> the key of status.lag it serves."""
AUTHENTICATION_CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"

Lister = Callable[[str, str], Awaitable[list[dict[str, Any]]]]
"""(namespace, label selector) -> the ConsumerGroups there."""


def metric_items(metric: str, groups: Sequence[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """The ExternalMetricValue of each group that has the figure; groups without it are left out
    (an HPA that gets no value holds its replicas)."""
    key = METRICS[metric]
    items = []
    for group in groups:
        value = ((group.get("status") or {}).get("lag") or {}).get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        meta = group.get("metadata") or {}
        items.append(
            {
                "metricName": metric,
                "metricLabels": {**(meta.get("labels") or {}), "consumergroup": str(meta.get("name", ""))},
                "timestamp": rfc3339(now),
                "value": str(value),
            }
        )
    return items


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    return web.json_response({**body, "reason": reason, "message": message}, status=code)


def create_app(list_groups: Lister, clock: Callable[[], float] = time.time) -> web.Application:
    """Discovery (``/apis``, the group, the version's resources) and the metric values."""

    async def apis(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group()]})

    async def group(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **_group()})

    async def resources(_: web.Request) -> web.Response:
        listed = [
            {
                "name": name,
                "singularName": "",
                "namespaced": True,
                "kind": "ExternalMetricValueList",
                "verbs": ["get"],
            }
            for name in METRICS
        ]
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": GROUP_VERSION,
                "resources": listed,
            }
        )

    async def values(request: web.Request) -> web.Response:
        namespace, metric = request.match_info["namespace"], request.match_info["metric"]
        if metric not in METRICS:
            return _status(404, "NotFound", f"no external metric {metric!r}; served: {', '.join(METRICS)}")
        selector = request.query.get("labelSelector", "")
        try:
            groups = await list_groups(namespace, selector)
        except ApiError as e:
            # The API server's answer for the operator (a bad selector, no rights in the namespace).
            code = e.status if 400 <= e.status < 500 else 503
            return _status(code, "ListFailed", f"listing ConsumerGroups in {namespace}: {e}")
        body = {
            "kind": "ExternalMetricValueList",
            "apiVersion": GROUP_VERSION,
            "metadata": {},
            "items": metric_items(metric, groups, clock()),
        }
        return web.json_response(body)

    app = web.Application()
    base = f"/apis/{GROUP}/{VERSION}"
    app.add_routes(
        [
            web.get("/apis", apis),
            web.get(f"/apis/{GROUP}", group),
            web.get(base, resources),
            web.get(base + "/namespaces/{namespace}/{metric}", values),
        ]
    )
    return app


def _group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"name": GROUP, "versions": [version], "preferredVersion": version}


def group_lister(client: KubeClient) -> Lister:
    async def list_groups(namespace: str, selector: str) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        answer = await client.get(f"{API_PATH}/namespaces/{namespace}/{CONSUMER_GROUPS}", params)
        return list(answer.get("items") or [])

    return list_groups


async def front_proxy_trust(client: KubeClient) -> tuple[str, list[str]]:
    """The CA of the API server's front-proxy client certificate and the names it may carry
    (empty: any), from ConfigMap kube-system/extension-apiserver-authentication."""
    try:
        data = (await client.get(AUTHENTICATION_CONFIGMAP)).get("data") or {}
    except ApiError as e:
        raise RuntimeError(
            f"cannot read {AUTHENTICATION_CONFIGMAP} (RBAC: extension-apiserver-authentication-reader): {e}"
        ) from None
    ca = data.get("requestheader-client-ca-file")
    if not ca:
        raise RuntimeError(
            "the API server publishes no requestheader-client-ca-file: its aggregation layer is off "
            "(--requestheader-client-ca-file, --proxy-client-cert-file): no APIService can reach the operator"
        )
    try:
        names = json.loads(data.get("requestheader-allowed-names") or "[]")
    except ValueError:
        names = []
    return ca, [str(n) for n in names or []]


def server_context(cert_dir: str | Path, client_ca: str) -> ssl.SSLContext:
    """TLS with the operator's serving certificate, requiring a client certificate of ``client_ca``."""
    directory = Path(cert_dir)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=client_ca)
    return context


def allowed_names_middleware(names: Sequence[str]) -> Any:
    """Refuse a client certificate whose common name is not one of ``names`` (none: any)."""
    allowed = set(names)

    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if allowed:
            peer = request.transport.get_extra_info("peercert") if request.transport else None
            subject = dict(pair[0] for pair in (peer or {}).get("subject", ()))
            if subject.get("commonName") not in allowed:
                return _status(403, "Forbidden", "client certificate not among requestheader-allowed-names")
        return await handler(request)

    return check


FORWARDED_HEADERS = 128
"""Header lines a request may have: the aggregation layer forwards the caller's every group and extra
as a header of its own (X-Remote-Group, X-Remote-Extra-*), so more than the other listeners take."""


async def serve(
    client: KubeClient, host: str, port: int, cert_dir: str | Path, limits: Limits | None = None
) -> web.AppRunner:
    """Read the front-proxy CA, then listen on ``host`` (addresses separated by commas) under ``limits``
    (mqbalance/listener.py); raises when the API server has no aggregation layer."""
    ca, names = await front_proxy_trust(client)
    app = create_app(group_lister(client))
    app.middlewares.append(allowed_names_middleware(names))
    limits = replace(limits or Limits(), max_headers=FORWARDED_HEADERS)
    context = server_context(cert_dir, ca)
    runner = await listener.serve(app, parse_hosts(host), port, limits, ssl_context=context)
    logger.info("external metrics (%s) on %s port %d", GROUP_VERSION, host, port)
    return runner
