"""The kopf handlers: thin adapters from watch events to the controller.

Pods, Nodes and Topics are kept in kopf indexes (kopf starts no daemon before every
index has its initial listing, so a restarted operator never reconciles a group
against a half-listed world and reshuffles nothing). Event handlers only poke the
groups an event concerns; one daemon per ConsumerGroup does the work.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

import kopf
from prometheus_client import CollectorRegistry

from mqbalance.operator.controller import Controller
from mqbalance.operator.journal import Journal
from mqbalance.operator.kopf_startup import patch_toggle_sets
from mqbalance.operator.kubeapi import GROUP, GROUP_LABEL, MANAGED_BY, VERSION, KubeApi, load_client
from mqbalance.operator.membership import PodInfo, pod_info
from mqbalance.operator.metrics import OperatorMetrics, create_app, serve
from mqbalance.operator.settings import OperatorConfig

FINALIZER = "mqbalance.io/operator"

# kopf's start-up wait for the indexes wakes every waiting object on every listed one.
patch_toggle_sets()


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
    app = create_app(registry, lambda: {"groups": len(controller.groups)})
    memo["http"] = await serve(app, config.metrics_port, config.metrics_host)
    logger.info("metrics and /healthz on port %d", config.metrics_port)


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    if "http" in memo:
        await memo["http"].cleanup()
    if "controller" in memo:
        controller: Controller = memo["controller"]
        controller.api.close()
        controller.journal.close()


def post_event(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    # Event messages are capped at 1 KiB by the API server.
    kopf.event(cast(kopf.Body, body), type=type, reason=reason, message=message[:1000])


# -- indexes ----------------------------------------------------------------------------------


@kopf.index("pods")
async def pods_by_namespace(namespace: str | None, body: kopf.Body, **_: Any) -> dict[str, PodInfo]:
    return {namespace or "": pod_info(body)}


@kopf.index("nodes")
async def node_labels(name: str, labels: kopf.Labels, **_: Any) -> dict[str, dict[str, str]]:
    return {name: dict(labels)}


@kopf.index(GROUP, VERSION, "topics")
async def topics_by_namespace(namespace: str | None, name: str, spec: kopf.Spec, **_: Any) -> dict[str, Any]:
    # A deep copy: the index must not share structure with the event's body.
    return {namespace or "": (name, json.loads(json.dumps(dict(spec))))}


class IndexedWorld:
    """The controller's view of the cluster, read from kopf's indexes."""

    def __init__(
        self, pods: kopf.Index[str, PodInfo], nodes: kopf.Index[str, Any], topics: kopf.Index[str, Any]
    ):
        self._pods, self._nodes, self._topics = pods, nodes, topics

    def pods(self, namespace: str) -> list[PodInfo]:
        return list(self._pods.get(namespace, []))

    def node_labels(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for name in names:
            for labels in self._nodes.get(name, []):
                out[name] = labels
        return out

    def topics(self, namespace: str) -> dict[str, Mapping[str, Any]]:
        return {name: spec for name, spec in self._topics.get(namespace, [])}


# -- events that poke groups ------------------------------------------------------------------


@kopf.on.event("pods")
async def pod_event(
    event: kopf.RawEvent, namespace: str | None, name: str, body: kopf.Body, memo: Any, **_: Any
) -> None:
    memo["controller"].on_pod(namespace or "", name, None if event["type"] == "DELETED" else pod_info(body))


@kopf.on.event("nodes")
async def node_event(event: kopf.RawEvent, name: str, labels: kopf.Labels, memo: Any, **_: Any) -> None:
    memo["controller"].on_node(name, None if event["type"] == "DELETED" else dict(labels))


@kopf.on.event(GROUP, VERSION, "topics")
async def topic_event(
    event: kopf.RawEvent, namespace: str | None, name: str, body: kopf.Body, memo: Any, **_: Any
) -> None:
    controller: Controller = memo["controller"]
    controller.on_topic(namespace or "", name)
    if event["type"] != "DELETED":
        await controller.update_topic_status(body)


@kopf.on.event(GROUP, VERSION, "consumergroups")
async def group_event(namespace: str | None, name: str, meta: kopf.Meta, memo: Any, **_: Any) -> None:
    memo["controller"].on_group(namespace or "", name, meta.get("generation"))


@kopf.on.event("configmaps", labels={MANAGED_BY[0]: MANAGED_BY[1], GROUP_LABEL: kopf.PRESENT})
async def configmap_event(
    event: kopf.RawEvent, namespace: str | None, labels: kopf.Labels, meta: kopf.Meta, memo: Any, **_: Any
) -> None:
    rv = None if event["type"] == "DELETED" else meta.get("resourceVersion")
    memo["controller"].on_configmap(namespace or "", labels[GROUP_LABEL], rv)


# -- one daemon per group -----------------------------------------------------------------------


@kopf.daemon(GROUP, VERSION, "consumergroups", cancellation_timeout=10.0)
async def group_daemon(body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    # kopf passes every index as a keyword argument named after its function.
    world = IndexedWorld(kwargs["pods_by_namespace"], kwargs["node_labels"], kwargs["topics_by_namespace"])
    controller: Controller = memo["controller"]
    await controller.run_group(body, world)
