"""Test support: a real local Kubernetes control plane and kubelet stand-ins."""
