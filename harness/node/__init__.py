"""Real nodes on this machine: a kubelet, containerd and kube-proxy per node beside the local control
plane, so pods run for real (docs/real-node.md). Needs root; one run per machine."""
