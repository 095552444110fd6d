"""The control plane's components as command lines: etcd, kube-apiserver, kube-controller-manager.

Pure functions of what each needs (binaries, ports, keys, the profile's flags); the cluster
(:class:`harness.kube.cluster.LocalCluster`) runs them as :class:`~harness.processes.managed.Component`.
"""

from __future__ import annotations

from pathlib import Path

from harness.kube.pki import Pki
from harness.kube.profile import SERVICE_CIDR

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def etcd_argv(etcd: Path, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(etcd),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync",  # tmpfs and throwaway data: durability buys nothing
        "--logger=zap",
        "--log-level=warn",
        "--quota-backend-bytes=2147483648",
    ]


def apiserver_argv(
    bin_dir: Path, minor: int, address: str, port: int, etcd_url: str, pki: Pki, profile_flags: list[str]
) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        f"--advertise-address={address}",
        f"--bind-address={address}",
        f"--secure-port={port}",
        # 1.20 serves plain HTTP on 8080 unless told not to; 1.24 removed the flag.
        *(["--insecure-port=0"] if minor < 24 else []),
        f"--etcd-servers={etcd_url}",
        f"--cert-dir={pki.directory}",
        f"--tls-cert-file={pki.path('apiserver.crt')}",
        f"--tls-private-key-file={pki.path('apiserver.key')}",
        f"--token-auth-file={pki.path('tokens.csv')}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-signing-key-file={pki.path('sa.key')}",
        f"--service-account-key-file={pki.path('sa.pub')}",
        f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        *pki.aggregation_flags(),
        *profile_flags,
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(
    bin_dir: Path,
    minor: int,
    kubeconfig: Path,
    pki: Pki,
    controllers_off: list[str],
    profile_flags: list[str],
) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        # 1.20 also serves plain HTTP on 10252 unless told not to (the flag is gone since 1.24).
        *(["--port=0"] if minor < 24 else []),
        "--secure-port=0",  # no fixed 10257 port: several clusters run side by side
        "--leader-elect=false",
        f"--controllers={','.join(['*', *(f'-{name}' for name in controllers_off)])}",
        f"--service-account-private-key-file={pki.path('sa.key')}",
        f"--root-ca-file={pki.path('ca.crt')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        *profile_flags,
        "--kube-api-qps=100",
        "--kube-api-burst=200",
        "--v=1",
    ]
