"""The operator's metrics on a registry of their own, and the HTTP endpoint."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mqbalance.operator.metrics import GroupGauges, OperatorMetrics, create_app


def gauges(**kw: Any) -> GroupGauges:
    base = dict(
        namespace="ns",
        group="g",
        members=3,
        queues=8,
        imbalance=1,
        topic_imbalance=1,
        cross_zone_queues=2,
        unassigned_queues=0,
        generation=7,
        invalid=False,
    )
    return GroupGauges(**{**base, **kw})


def test_group_gauges_are_built_at_scrape_time() -> None:
    registry = CollectorRegistry()
    state = [gauges()]
    metrics = OperatorMetrics(registry, lambda: state)
    assert registry.get_sample_value("mqbalance_group_members", {"namespace": "ns", "group": "g"}) == 3
    assert (
        registry.get_sample_value("mqbalance_group_assignment_generation", {"namespace": "ns", "group": "g"})
        == 7
    )
    state[:] = [gauges(group="h", invalid=True)]
    assert registry.get_sample_value("mqbalance_group_members", {"namespace": "ns", "group": "g"}) is None
    assert registry.get_sample_value("mqbalance_group_invalid", {"namespace": "ns", "group": "h"}) == 1
    metrics.rebalances.labels("member-joined").inc()
    metrics.queues_moved.inc(4)
    metrics.rebalance_duration.observe(0.003)
    assert registry.get_sample_value("mqbalance_rebalances_total", {"reason": "member-joined"}) == 1
    assert registry.get_sample_value("mqbalance_queues_moved_total") == 4
    assert registry.get_sample_value("mqbalance_rebalance_duration_seconds_count") == 1


@pytest.mark.asyncio
async def test_metrics_and_healthz_are_served(aiohttp_client: Any) -> None:
    registry = CollectorRegistry()
    OperatorMetrics(registry, lambda: [gauges()])
    client = await aiohttp_client(create_app(registry, lambda: {"groups": 1}))
    response = await client.get("/metrics")
    assert response.status == 200
    assert 'mqbalance_group_queues{group="g",namespace="ns"} 8.0' in await response.text()
    health = await client.get("/healthz")
    assert await health.json() == {"status": "ok", "groups": 1}


@pytest.mark.asyncio
async def test_a_scrape_restricted_by_name_renders_no_group_gauges(aiohttp_client: Any) -> None:
    registry = CollectorRegistry()
    gauge_reads = [0]

    def groups() -> list[GroupGauges]:
        gauge_reads[0] += 1
        return [gauges()]

    metrics = OperatorMetrics(registry, groups, lag=lambda: [])
    metrics.reconciles.labels("published").inc(3)
    client = await aiohttp_client(create_app(registry, lambda: {}))

    restricted = await client.get("/metrics", params=[("name[]", "mqbalance_reconciles_total")])
    text = await restricted.text()
    assert 'mqbalance_reconciles_total{result="published"} 3.0' in text
    assert "mqbalance_group_" not in text
    assert "mqbalance_operator_leader" not in text
    assert gauge_reads == [0]

    both = await client.get(
        "/metrics", params=[("name[]", "mqbalance_group_queues"), ("name[]", "mqbalance_operator_leader")]
    )
    text = await both.text()
    assert 'mqbalance_group_queues{group="g",namespace="ns"} 8.0' in text
    assert 'mqbalance_operator_leader{lease=""} 1.0' in text
    assert "mqbalance_group_members" not in text
    assert "mqbalance_reconciles_total" not in text
    assert gauge_reads == [1]

    whole = await (await client.get("/metrics")).text()
    assert "mqbalance_group_members" in whole
    assert "mqbalance_reconciles_total" in whole
