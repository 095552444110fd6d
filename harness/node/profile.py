"""The control plane of real nodes (:class:`NodesProfile`): the API server at the node's address
with what pods and kubelets need (client certificates, NodeRestriction, the kubelets', the
scheduler's and kube-proxy's users), and the controller manager with every controller a node needs.
"""

from __future__ import annotations

import subprocess

from harness.kube.pki import Pki
from harness.kube.profile import User, Versions
from harness.node.specs import NODE_IP, POD_CIDR, NodeSpec

SCHEDULER_USER = "system:kube-scheduler"
PROXY_USER = "system:kube-proxy"


class NodesProfile:
    """A control plane for the nodes ``specs``: the API server on :data:`~harness.node.specs.NODE_IP`."""

    listen_address = NODE_IP

    def __init__(self, specs: list[NodeSpec]) -> None:
        self.specs = specs

    def kubelet_kubeconfig(self, spec: NodeSpec) -> str:
        return "kubelet.kubeconfig" if len(self.specs) == 1 else f"kubelet-{spec.name}.kubeconfig"

    def serving_names(self) -> tuple[str, ...]:
        return (f"IP:{NODE_IP}", "DNS:kubernetes.default.svc.cluster.local")

    def write_keys(self, pki: Pki) -> None:
        # kube-apiserver -> kubelet (logs, exec, port-forward): a client in system:masters.
        subject = "/O=system:masters/CN=kube-apiserver-kubelet-client"
        pki.issue("apiserver-kubelet-client", subject, "ca", "clientAuth")

    def users(self) -> tuple[User, ...]:
        kubelets = [
            User(spec.user, f"kubelet-{spec.name}", ("system:nodes",), self.kubelet_kubeconfig(spec))
            for spec in self.specs
        ]
        return (
            *kubelets,
            User(SCHEDULER_USER, SCHEDULER_USER, (), "scheduler.kubeconfig"),
            User(PROXY_USER, PROXY_USER, (), "proxy.kubeconfig"),
        )

    def apiserver_flags(self, pki: Pki) -> list[str]:
        return [
            f"--client-ca-file={pki.path('ca.crt')}",
            f"--kubelet-client-certificate={pki.path('apiserver-kubelet-client.crt')}",
            f"--kubelet-client-key={pki.path('apiserver-kubelet-client.key')}",
            "--kubelet-preferred-address-types=InternalIP",
            "--enable-admission-plugins=NodeRestriction",
            # Straight to an APIService's pod, not through its Service's cluster IP.
            "--enable-aggregator-routing=true",
        ]

    def controller_manager_flags(self) -> list[str]:
        return [
            # One identity per controller: the node lifecycle controller's own rights are what
            # lets it lift the not-ready taint.
            "--use-service-account-credentials=true",
            f"--cluster-cidr={POD_CIDR}",
            "--allocate-node-cidrs=false",
            # A stopped kubelet turns the node NotReady within 16 s (default 40 s).
            "--node-monitor-period=2s",
            "--node-monitor-grace-period=16s",
            # HorizontalPodAutoscalers act within seconds (default 15 s): tests wait for them.
            "--horizontal-pod-autoscaler-sync-period=2s",
        ]

    def controllers_off(self, versions: Versions) -> list[str]:
        """Everything a node needs runs (node lifecycle, service accounts and their tokens, ...) but
        what needs a cloud, a CA we do not run, or node CIDR allocation; by the names this release
        knows (1.27 renamed them, later releases dropped the cloud ones)."""
        wanted = (
            ("cloud-node-lifecycle",),
            ("route",),
            ("service",),
            ("nodeipam", "node-ipam-controller"),
            ("csrsigning", "certificatesigningrequest-signing-controller"),
            ("csrapproving", "certificatesigningrequest-approving-controller"),
            ("csrcleaner", "certificatesigningrequest-cleaner-controller"),
        )
        argv = [str(versions.bin_dir / "kube-controller-manager"), "--help"]
        help_text = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        known: set[str] = set()
        for line in help_text.splitlines():
            if "All controllers:" in line:
                known = {name.strip() for name in line.split("All controllers:", 1)[1].split(",")}
        return [name for names in wanted for name in names if name in known]
