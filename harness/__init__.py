"""The development harness: a real local Kubernetes control plane, kubelet stand-ins, the demo.

Not part of the distribution: tests, benchmarks and the demo import it from a checkout.
"""
