"""The mqbalance resources that describe a RocketMQ to the operator: a Topic that lists its brokers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def topic_resource(
    name: str, namespace: str, brokers: Sequence[str], queues: int, zone: str | None = None
) -> dict[str, Any]:
    """The mqbalance Topic ``name`` (also its RocketMQ topic) listing ``brokers`` statically, each
    with ``queues`` read and write queues, in ``zone`` when one is given."""
    placed = {"zone": zone} if zone is not None else {}
    return {
        "apiVersion": "mqbalance.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "topicName": name,
            "brokers": [
                {"name": b, **placed, "readQueueNums": queues, "writeQueueNums": queues} for b in brokers
            ],
        },
    }
