"""Helpers of the deployment tests: running helm, rendering the chart, service-account kubeconfigs, can-i.

Test modules import these from here, not from conftest.py: with several test folders on the
command line, the module named ``conftest`` may be another folder's.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from harness.kube.cluster import LocalCluster
from harness.polling import scaled, wait_for

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "mqbalance"
GROUP = "orders-consumer"
"""The consumer group the installed chart's sidecars are narrowed to."""


API_SERVER_GAVE_UP = "Timeout: request did not complete within requested timeout"
"""The API server's 504: its own request timeout ran out (a starved machine); helm does not retry it."""


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``helm ARGS``; run once more when the API server gave up on one of its requests (an install or
    upgrade run again applies the same manifests)."""
    for _ in range(2):
        result = subprocess.run(
            [str(helm), *args], capture_output=True, text=True, timeout=scaled(120), check=False
        )
        if result.returncode == 0 or API_SERVER_GAVE_UP not in result.stderr:
            break
    if check and result.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    """The chart's objects as ``helm template`` renders them for release ``mq`` in ``mq-system``."""
    return documents(run_helm(helm, "template", "mq", str(CHART), "--namespace", "mq-system", *args).stdout)


def template_refused(helm: Path, *args: str) -> str:
    """What ``helm template`` of the chart with ``args`` says on refusing it (it must refuse)."""
    result = run_helm(helm, "template", "mq", str(CHART), *args, check=False)
    assert result.returncode != 0, args
    return result.stderr


def assert_values_refused(helm: Path, cases: Iterable[tuple[str, str]]) -> None:
    """``helm template`` refuses each case's ``--set`` values (``a=1,b=2`` sets two), naming its complaint."""
    for values, complaint in cases:
        said = template_refused(helm, "--set", values)
        assert complaint in said, said


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def service_account_token(
    cluster: LocalCluster,
    namespace: str,
    name: str,
    timeout: float = 60.0,
    pod: tuple[str, str] | None = None,
) -> str:
    """A bound token of the ServiceAccount (TokenRequest), once the account exists; with ``pod``
    (name, uid), bound to that pod as the kubelet's is."""
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
    wait_for(
        f"ServiceAccount {namespace}/{name} to appear",
        lambda: cluster.request("GET", path)[0] == 200,
        timeout,
        0.2,
    )
    return cluster.service_account_token(namespace, name, pod=pod)


def service_account_kubeconfig(
    cluster: LocalCluster, namespace: str, name: str, path: Path, pod: tuple[str, str] | None = None
) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount, as its pod would in-cluster (with
    ``pod``: as that pod, its token bound to it)."""
    user = f"system:serviceaccount:{namespace}:{name}"
    token = service_account_token(cluster, namespace, name, pod=pod)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": cluster.server, "certificate-authority": str(cluster.ca_file)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": user, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def can_i(
    cluster: LocalCluster,
    subject: str,
    verb: str,
    resource: str,
    namespace: str | None,
    subresource: str = "",
) -> bool:
    """``kubectl auth can-i`` impersonating ``subject`` (the admin may impersonate anyone).

    ``resource`` is ``kind`` or ``kind/name``; a subresource such as ``status`` goes apart."""
    scope = ["-n", namespace] if namespace else []
    if subresource:
        scope.append(f"--subresource={subresource}")
    result = cluster.kubectl("auth", "can-i", verb, resource, f"--as={subject}", *scope, check=False)
    answer = result.stdout.strip()
    if answer not in ("yes", "no"):
        raise AssertionError(f"kubectl auth can-i {verb} {resource} answered {answer!r}: {result.stderr}")
    return answer == "yes"


def permitted(
    cluster: LocalCluster, subject: str, requests: Iterable[tuple[str, str, str | None]]
) -> list[tuple[str, str, str | None]]:
    """The (verb, resource, namespace) of ``requests`` that ``subject`` may do (:func:`can_i`)."""
    return [
        (verb, resource, ns) for verb, resource, ns in requests if can_i(cluster, subject, verb, resource, ns)
    ]


DENIED = re.compile(r"(?<![\d,.])403(?!\d)|forbidden", re.IGNORECASE)
"""An API server's refusal in a log: "HTTP 403: ... is forbidden". Not a 403 in a log line's
milliseconds (",403") or in a fraction ("0.403"): those made the check fail by chance."""


TERMINATING = "because it is being terminated"
"""A write into a namespace being deleted: refused for that, not for want of a right (a cluster-wide
operator sees the namespaces of tests that just finished)."""


def assert_no_denials(logs: str) -> None:
    lines = [line for line in logs.splitlines() if TERMINATING not in line]
    found = DENIED.search("\n".join(lines))
    assert found is None, f"the API server refused a call ({found.group()!r}):\n{logs}"


@contextlib.contextmanager
def installed(
    cluster: LocalCluster, helm: Path, namespace: str, *values: str, cluster_wide: bool = False
) -> Iterator[str]:
    """The chart installed in ``namespace`` with ``values`` set, watching only that namespace (or,
    ``cluster_wide``, all), sidecars narrowed to GROUP; uninstalled afterwards (cluster-scoped objects
    outlive the namespace: the injector's webhook configuration, the ClusterRoles)."""
    name = f"mqb-{uuid.uuid4().hex[:6]}"
    watch = [] if cluster_wide else ["--set", f"operator.watchNamespaces={{{namespace}}}"]
    run_helm(
        helm, "install", name, str(CHART),
        "--kubeconfig", str(cluster.kubeconfig),
        "--namespace", namespace,
        *watch,
        "--set", f"sidecar.groups={{{GROUP}}}",
        *(arg for value in values for arg in ("--set", value)),
        "--wait=false",
    )  # fmt: skip
    try:
        yield name
    finally:
        run_helm(helm, "uninstall", name, "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace)
