"""Names the operator, the sidecar, the chart and the clients agree on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

GROUP = "mqbalance.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
API_PATH = f"/apis/{GROUP}/{VERSION}"

TOPIC_KIND, TOPICS = "Topic", "topics"
CONSUMER_GROUP_KIND, CONSUMER_GROUPS = "ConsumerGroup", "consumergroups"
OFFSET_RESET_KIND, OFFSET_RESETS = "OffsetReset", "offsetresets"
APPROVE_ANNOTATION = "mqbalance.io/approve"
"""An OffsetReset annotated with it set to "true" is approved: its preview is applied."""

MANAGED_BY = ("app.kubernetes.io/managed-by", "mqbalance")
"""Label (key, value) on every object the operator writes."""
GROUP_LABEL = "mqbalance.io/group"
"""Label on a group's ConfigMaps: the ConsumerGroup resource name."""
GENERATION_ANNOTATION = "mqbalance.io/generation"
"""Annotation on the assignment ConfigMap: the generation it holds."""
MAX_GROUP_NAME = 63
"""Longest ConsumerGroup resource name: it is a label value on the group's ConfigMaps."""
MEMBER_LEASE_LABEL = ("mqbalance.io/member", "true")
"""Label (key, value) on every member Lease a sidecar renews (time-bounded ownership)."""
MEMBER_LEASE_SUFFIX = "-mqbalance-member"
MEMBER_CLIENTS_ANNOTATION = "mqbalance.io/rocketmq-clients"
"""Annotation on a member Lease: the RocketMQ client ids of the pod's consumers (a JSON list, newest
last), so the operator can release a fenced member's broker locks on its behalf (handover Orderly)."""
MAX_MEMBER_CLIENTS = 8
"""Client ids a member Lease names: a pod's consumers, and those its restarted containers had."""
MAX_CLIENT_ID = 255
"""Longest RocketMQ client id kept (``ip@instanceName[@unitName]``)."""
SIDECAR_CONTAINER = "mqbalance-sidecar"
"""The sidecar container's name, in every pod spec the project writes or injects."""
SIDECAR_GROUP_ANNOTATION = "mqbalance.io/sidecar-group"
"""Pod annotation naming the ConsumerGroup(s) the pod's sidecar serves (comma-separated): a pod with
it asks for the sidecar, and one that runs without it holds no queues."""
INJECTION_LABEL = ("mqbalance.io/sidecar-injection", "enabled")
"""Label (key, value) of a namespace, and of each pod in it, whose pods the webhook injects."""
MAX_NAME = 253


def custom_path(plural: str, namespace: str | None = None, name: str | None = None) -> str:
    """The API path of our custom resources (all of a kind, a namespace's, or one)."""
    path = API_PATH
    if namespace is not None:
        path += f"/namespaces/{namespace}"
    path += f"/{plural}"
    if name is not None:
        path += f"/{name}"
    return path


def member_lease_name(pod: str) -> str:
    """The coordination.k8s.io Lease a pod's sidecar renews, in the pod's namespace:
    ``<pod>-mqbalance-member``; a pod name too long for that keeps its start and a hash of the whole."""
    name = pod + MEMBER_LEASE_SUFFIX
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(pod.encode()).hexdigest()[:10]
    return f"{pod[: MAX_NAME - len(MEMBER_LEASE_SUFFIX) - 11]}-{digest}{MEMBER_LEASE_SUFFIX}"


def valid_client_id(text: str) -> bool:
    """Whether ``text`` can be a RocketMQ client id: printable ASCII without spaces, not too long."""
    return 0 < len(text) <= MAX_CLIENT_ID and all("!" <= c <= "~" for c in text)


def member_clients(annotations: Mapping[str, str] | None) -> tuple[str, ...]:
    """The client ids a member Lease's annotations name: at most ``MAX_MEMBER_CLIENTS`` valid ones
    (the newest); anything else written there is ignored (a pod writes its own Lease)."""
    text = (annotations or {}).get(MEMBER_CLIENTS_ANNOTATION)
    if not text or len(text) > MAX_MEMBER_CLIENTS * (MAX_CLIENT_ID + 4) + 2:
        return ()
    try:
        ids = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(ids, list):
        return ()
    valid = [i for i in ids if isinstance(i, str) and valid_client_id(i)]
    return tuple(valid[-MAX_MEMBER_CLIENTS:])
