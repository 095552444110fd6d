"""The one Kubernetes edge of the operator and the sidecar: an asynchronous API client, the
list-and-watch informer, and Lease locks. Nothing else in the product talks to the API server."""

from mqbalance.kube.client import MERGE_PATCH, ApiError, Conflict, Gone, KubeClient, kubeconfig_namespace
from mqbalance.kube.compact import compact
from mqbalance.kube.informer import Backoff, Informer, Key, object_key
from mqbalance.kube.lease import LeaseElector, LeaseLock, default_identity, parse_micro_time
from mqbalance.kube.lease_loop import LeaseLoop

__all__ = [
    "MERGE_PATCH",
    "ApiError",
    "Backoff",
    "Conflict",
    "Gone",
    "Informer",
    "Key",
    "KubeClient",
    "LeaseElector",
    "LeaseLock",
    "LeaseLoop",
    "compact",
    "default_identity",
    "kubeconfig_namespace",
    "object_key",
    "parse_micro_time",
]
