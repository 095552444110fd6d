"""Kubernetes for the tests: a local control plane composed of its components (``cluster``), the
harness's one blocking client (``api``), kubelet stand-ins (``kubelet``) and kwok's fake nodes
(``kwok``). Real nodes on this machine are :mod:`harness.node`."""
