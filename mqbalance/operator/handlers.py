"""The kopf handlers: thin adapters from watch events to the controller.

kopf watches the ConsumerGroups and runs one daemon per group. Pods, Nodes, Topics
and the assignment ConfigMaps are watched by the operator's own informers
(informer.py) into the controller's caches: for those kopf's per-object handling
costs more than everything else the operator does at scale, and the controller
needs only a snapshot of each. The daemons wait until every informer has listed its
objects once, so a restarted operator never reconciles a group against a
half-listed world and reshuffles nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf
from prometheus_client import CollectorRegistry

from mqbalance.operator.controller import Controller
from mqbalance.operator.informer import Informer, Key
from mqbalance.operator.journal import Journal
from mqbalance.operator.kubeapi import (
    GROUP,
    GROUP_LABEL,
    MANAGED_BY,
    VERSION,
    ApiError,
    KubeApi,
    load_client,
)
from mqbalance.operator.membership import PodInfo, pod_info
from mqbalance.operator.metrics import OperatorMetrics, create_app, serve
from mqbalance.operator.settings import OperatorConfig

FINALIZER = "mqbalance.io/operator"
CONFIGMAP_SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{GROUP_LABEL}"

logger = logging.getLogger("mqbalance.operator")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    config: OperatorConfig = memo["config"]
    settings.persistence.finalizer = FINALIZER
    # Only explicit kopf.event() calls become Events, not every log line.
    settings.posting.loggers = False
    # A pod turning Ready should reach the group at once; kopf's default batches for 0.1 s.
    settings.batching.batch_window = config.batch_window
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    api = KubeApi(load_client(config.kubeconfig))
    registry = CollectorRegistry()
    controller_box: list[Controller] = []
    metrics = OperatorMetrics(registry, lambda: controller_box[0].gauges() if controller_box else [])
    controller = Controller(
        api,
        metrics,
        Journal(config.journal),
        post_event,
        debounce_override=config.debounce_override,
    )
    controller_box.append(controller)
    memo["controller"] = controller
    informers = create_informers(controller, config)
    memo["informers"] = informers
    for informer in informers:
        informer.start()
    memo["synced"] = asyncio.create_task(wait_synced(controller, informers))
    app = create_app(registry, lambda: {"groups": len(controller.groups)})
    memo["http"] = await serve(app, config.metrics_port, config.metrics_host)
    logger.info("metrics and /healthz on port %d", config.metrics_port)


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    if "http" in memo:
        await memo["http"].cleanup()
    for informer in memo.get("informers", []):
        informer.stop()
        informer.api.close()
    if "synced" in memo:
        memo["synced"].cancel()
    if "controller" in memo:
        controller: Controller = memo["controller"]
        controller.api.close()
        controller.journal.close()


def post_event(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    # Event messages are capped at 1 KiB by the API server.
    kopf.event(cast(kopf.Body, body), type=type, reason=reason, message=message[:1000])


# -- the operator's own informers ------------------------------------------------------------


def create_informers(controller: Controller, config: OperatorConfig) -> list[Informer[Any]]:
    """Pods, Topics and our ConfigMaps in every served namespace (or cluster-wide), and all Nodes."""
    scopes = [""] if config.all_namespaces else [f"/namespaces/{ns}" for ns in config.namespaces]
    # Each watch holds a connection of its own for its whole life.
    api = KubeApi(load_client(config.kubeconfig, pool_size=3 * len(scopes) + 1), workers=1)
    background: set[asyncio.Task[None]] = set()

    def pod_changed(key: Key, old: PodInfo | None, new: PodInfo | None) -> None:
        controller.on_pod(key[0], key[1], new)

    def topic_changed(key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        controller.on_topic(key[0], key[1], None if new is None else new["spec"])
        if new is not None:
            task = asyncio.ensure_future(update_topic_status(controller, new))
            background.add(task)
            task.add_done_callback(background.discard)

    def configmap_changed(key: Key, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        group = ((new or old or {}).get("metadata") or {}).get("labels", {}).get(GROUP_LABEL, "")
        controller.on_configmap(key[0], key[1], group, new)

    informers: list[Informer[Any]] = [
        Informer(api, "/api/v1/nodes", node_labels, lambda key, old, new: controller.on_node(key[1], new))
    ]
    for scope in scopes:
        informers += [
            Informer(api, f"/api/v1{scope}/pods", pod_info, pod_changed),
            Informer(api, f"/apis/{GROUP}/{VERSION}{scope}/topics", topic_snapshot, topic_changed),
            Informer(
                api, f"/api/v1{scope}/configmaps", configmap_snapshot, configmap_changed, CONFIGMAP_SELECTOR
            ),
        ]
    return informers


async def wait_synced(controller: Controller, informers: list[Informer[Any]]) -> None:
    await asyncio.gather(*(informer.synced.wait() for informer in informers))
    controller.synced.set()
    logger.info(
        "listed %d pods, %d nodes, %d topics, %d assignment ConfigMaps; groups reconcile now",
        len(controller.pods),
        len(controller.node_labels),
        sum(len(t) for t in controller.topics.values()),
        len(controller.configmaps),
    )


def node_labels(body: Mapping[str, Any]) -> dict[str, str]:
    return dict((body.get("metadata") or {}).get("labels") or {})


def topic_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator reads of a Topic: its spec, and what its status update needs."""
    meta = body.get("metadata") or {}
    return {
        "metadata": {k: meta.get(k) for k in ("namespace", "name", "generation")},
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }


def configmap_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return {"metadata": meta, "data": dict(body.get("data") or {})}


async def update_topic_status(controller: Controller, body: Mapping[str, Any]) -> None:
    try:
        await controller.update_topic_status(body)
    except ApiError as e:
        meta = body["metadata"]
        logger.warning("status of Topic %s/%s not written: %s", meta["namespace"], meta["name"], e)


# -- ConsumerGroups ----------------------------------------------------------------------------


@kopf.on.event(GROUP, VERSION, "consumergroups")
async def group_event(namespace: str | None, name: str, meta: kopf.Meta, memo: Any, **_: Any) -> None:
    memo["controller"].on_group(namespace or "", name, meta.get("generation"))


@kopf.daemon(GROUP, VERSION, "consumergroups", cancellation_timeout=10.0)
async def group_daemon(body: kopf.Body, memo: Any, **_: Any) -> None:
    controller: Controller = memo["controller"]
    await controller.run_group(body)
