"""Helpers for the operator's integration tests: the operator process, resources, polling."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.kube.cluster import LocalCluster
from harness.polling import wait_for
from mqbalance.contract import CONFIGMAP_KEY, AssignmentDocument, configmap_name

GROUP, VERSION = "mqbalance.io", "v1alpha1"
REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0

T = TypeVar("T")


# -- resources ----------------------------------------------------------------------------------


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def apply_topic(
    api: client.ApiClient,
    namespace: str,
    name: str,
    brokers: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> None:
    """Create or patch Topic ``name``; ``brokers`` None leaves spec.brokers out (a route read from
    the NameServer in ``spec``)."""
    _apply(api, namespace, "Topic", name, {**({"brokers": brokers} if brokers is not None else {}), **spec})


def apply_group(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    _apply(api, namespace, "ConsumerGroup", name, spec)


def _apply(api: client.ApiClient, namespace: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    """Create the ``kind`` (Topic, ConsumerGroup) ``name``, or patch its spec where it exists."""
    plural = f"{kind.lower()}s"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": spec}
    try:
        custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    except ApiException as e:
        if e.status != 409:
            raise
        custom(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, {"spec": spec})


def get_group(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "consumergroups", name)
        return cast(dict[str, Any], obj)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def status_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj = get_group(api, namespace, name) or {}
    return dict(obj.get("status") or {})


def condition(status: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return next((dict(c) for c in status.get("conditions") or [] if c.get("type") == kind), {})


def read_document(api: client.ApiClient, namespace: str, group: str) -> AssignmentDocument | None:
    try:
        cm = client.CoreV1Api(api).read_namespaced_config_map(configmap_name(group), namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return AssignmentDocument.decode((cm.data or {})[CONFIGMAP_KEY])


def status_for(api: client.ApiClient, namespace: str, group: str, generation: int) -> dict[str, Any]:
    """The group's status once it describes assignment ``generation`` (``status.assignmentGeneration``).

    The operator writes the status after the ConfigMap, so a status read at once after a new
    generation shows in the ConfigMap may still describe the generation before it.
    """

    def probe() -> dict[str, Any] | None:
        status = status_of(api, namespace, group)
        return status if status.get("assignmentGeneration") == generation else None

    return wait_for(f"{namespace}/{group} status of generation {generation}", probe)


def wait_generation(api: client.ApiClient, namespace: str, group: str, at_least: int) -> AssignmentDocument:
    """The group's document once its generation reaches ``at_least`` and status agrees."""

    def probe() -> AssignmentDocument | None:
        doc = read_document(api, namespace, group)
        if doc is None or doc.generation < at_least:
            return None
        if status_of(api, namespace, group).get("assignmentGeneration") != doc.generation:
            return None
        return doc

    return wait_for(f"{namespace}/{group} generation >= {at_least}", probe)


def events_of(api: client.ApiClient, namespace: str, name: str, reason: str | None = None) -> list[Any]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [e for e in events.items if reason is None or e.reason == reason]


def kubectl_json(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def env_without_incluster() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
