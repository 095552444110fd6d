"""Events are posted in the background, paced, and dropped (and counted) beyond what may wait."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mqbalance.operator.metrics import OperatorMetrics
from mqbalance.operator.writes import EVENT_BURST, EVENT_QUEUE, EVENT_RATE, Writer

pytestmark = pytest.mark.asyncio

GROUP = {"kind": "ConsumerGroup", "metadata": {"namespace": "shop", "name": "orders", "uid": "u-1"}}


class Api:
    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, Any]]] = []

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.posted.append((path, body))
        return body


async def test_an_event_is_posted_on_its_object() -> None:
    api = Api()
    writer = Writer(api)  # type: ignore[arg-type]
    writer.post_event(GROUP, "Normal", "Rebalanced", "published generation 1")
    poster = asyncio.create_task(writer.run_event_poster())
    await asyncio.sleep(0.01)
    poster.cancel()
    [(path, body)] = api.posted
    assert path == "/api/v1/namespaces/shop/events"
    assert body["involvedObject"] == {
        "apiVersion": "mqbalance.io/v1alpha1",
        "kind": "ConsumerGroup",
        "name": "orders",
        "namespace": "shop",
        "uid": "u-1",
    }
    assert (body["type"], body["reason"]) == ("Normal", "Rebalanced")
    assert body["message"] == "published generation 1"
    assert body["metadata"] == {"generateName": "orders.", "namespace": "shop"}
    assert body["firstTimestamp"] == body["lastTimestamp"]


async def test_beyond_the_queue_events_are_dropped_and_counted() -> None:
    api = Api()
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry, list)
    writer = Writer(api)  # type: ignore[arg-type]
    writer.on_event_dropped = metrics.events_dropped.inc
    for i in range(EVENT_QUEUE + 25):
        writer.post_event(GROUP, "Normal", "Rebalanced", f"generation {i}")
    assert registry.get_sample_value("mqbalance_operator_events_dropped_total") == 25
    loop = asyncio.get_running_loop()
    started = loop.time()
    poster = asyncio.create_task(writer.run_event_poster())
    await asyncio.sleep(0.05)
    poster.cancel()
    elapsed = loop.time() - started  # more than 0.05 s on a busy machine: the bound follows it
    # A burst goes at once, the rest at the paced rate; the oldest first.
    assert EVENT_BURST <= len(api.posted) <= EVENT_BURST + 2 + elapsed * EVENT_RATE
    assert api.posted[0][1]["message"] == "generation 0"
