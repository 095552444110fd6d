"""The series every mqbalance process exports besides its own: build info and the process's.

The operator and the sidecar each render a private registry, never prometheus_client's global
one, so the standard process and platform collectors are registered on it here. Counters and
histograms export no ``_created`` series: Prometheus would store one more series per counter
that no rule or dashboard reads. ``exposition`` renders a registry for ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client import (
    CollectorRegistry,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from mqbalance import buildinfo


def register_process_metrics(registry: CollectorRegistry, component: str) -> Info:
    """Register ``mqbalance_build_info{component, version, python_version, ...} 1``, ``process_*``
    (CPU, memory, file descriptors, start time; Linux only) and ``python_info`` on ``registry``."""
    # A process-wide switch, read as samples are collected: it applies to every registry,
    # private ones included. (PROMETHEUS_DISABLE_CREATED_SERIES is read once, when
    # prometheus_client is imported, so it is no use to set it from here.)
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    info = Info(
        "mqbalance_build", "Always 1: the mqbalance version and Python of this process.", registry=registry
    )
    info.info(buildinfo.labels(component))
    return info


def exposition(registry: CollectorRegistry, names: Collection[str]) -> bytes:
    """The text format of ``registry``, or only of the series ``names`` when there are any.

    ``names`` are the ``name[]`` query parameters, as prometheus_client's and client_golang's
    handlers take them: a client that wants one counter skips the rendering of every group's
    gauges (collectors that ``describe()`` themselves are not collected for other names).
    """
    return generate_latest(registry.restricted_registry(names) if names else registry)
