"""Reading the product's Prometheus metrics in the harness."""

from __future__ import annotations

from collections.abc import Mapping


def parse_metric(text: str, name: str, labels: Mapping[str, str]) -> float:
    """Sum of the samples of ``name`` in Prometheus text whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        got = {}
        for part in rest.rstrip("}").split('",'):
            if "=" in part:
                key, _, val = part.partition("=")
                got[key.strip()] = val.strip().strip('"')
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total
