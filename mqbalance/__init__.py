"""mqbalance: RocketMQ-style consumer group load balancing under Kubernetes control.

The top-level package is the core library: it knows nothing of Kubernetes, HTTP or
Spark. ``mqbalance.operator``, ``mqbalance.sidecar`` and ``mqbalance.pipeline``
build on it.
"""

__version__ = "0.2.0"
