"""The fleet bench's pure helpers: pod placement, the API server's request figures, the model."""

from __future__ import annotations

import collections
import math

import pytest

from bench.bench_fleet import (
    FleetModel,
    RequestFigures,
    histogram_quantile,
    operator_requests,
    parse_labels,
    place_pods,
)
from harness.kube.kwok import FAKE_NODE_ANNOTATION, ZONE_LABEL, node_body, pod_body, zone_of


def test_place_pods_spreads_each_group_over_consecutive_nodes() -> None:
    placed = place_pods(groups=10, pods=105, nodes=30)
    assert len(placed) == 105
    per_group = collections.Counter(g for g, _, _ in placed)
    assert sorted(per_group.values()) == [10] * 5 + [11] * 5
    for g in range(10):
        nodes = [n for gg, _, n in placed if gg == g]
        assert len(set(nodes)) == len(nodes)  # no two members of a group on one node
        assert {zone_of(n, ("a", "b", "c")) for n in nodes} == {"a", "b", "c"}
    per_node = collections.Counter(n for _, _, n in placed)
    assert max(per_node.values()) - min(per_node.values()) <= 1


def test_parse_labels() -> None:
    assert parse_labels('verb="PUT",resource="configmaps",le="0.05"') == {
        "verb": "PUT",
        "resource": "configmaps",
        "le": "0.05",
    }
    assert parse_labels("") == {}


def test_histogram_quantile_interpolates_within_the_bucket() -> None:
    buckets = {0.1: 50.0, 0.2: 90.0, 1.0: 100.0, math.inf: 100.0}
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.1)
    assert histogram_quantile(buckets, 0.7) == pytest.approx(0.15)
    assert histogram_quantile(buckets, 0.99) == pytest.approx(0.2 + 0.8 * 0.9)
    assert math.isnan(histogram_quantile({math.inf: 0.0}, 0.5))
    assert histogram_quantile({1.0: 0.0, math.inf: 5.0}, 0.5) == 1.0  # all above the last bound


METRICS = """\
# HELP apiserver_request_total Counter of apiserver requests
apiserver_request_total{code="200",component="apiserver",resource="configmaps",verb="PUT"} 7
apiserver_request_total{code="201",component="apiserver",resource="events",verb="POST"} 3
apiserver_request_total{code="200",component="apiserver",resource="pods",verb="PATCH"} 11
apiserver_request_total{code="200",component="apiserver",resource="configmaps",verb="WATCH"} 99
apiserver_request_duration_seconds_bucket{resource="configmaps",verb="PUT",le="0.05"} 6
apiserver_request_duration_seconds_bucket{resource="configmaps",verb="PUT",le="+Inf"} 7
apiserver_request_duration_seconds_bucket{resource="events",verb="POST",le="0.05"} 3
apiserver_request_duration_seconds_bucket{resource="events",verb="POST",le="+Inf"} 3
apiserver_request_duration_seconds_bucket{resource="pods",verb="PATCH",le="0.05"} 1
apiserver_request_duration_seconds_bucket{resource="pods",verb="PATCH",le="+Inf"} 11
"""


def test_operator_requests_counts_only_the_operators_mutating_calls() -> None:
    figures = operator_requests(METRICS)
    assert figures.calls == 10
    assert figures.all_mutating == 21
    assert figures.buckets == {0.05: 9.0, math.inf: 10.0}
    later = RequestFigures(15, {0.05: 12.0, math.inf: 15.0}, 30)
    delta = later.minus(figures)
    assert (delta.calls, delta.all_mutating) == (5, 9)
    assert delta.buckets == {0.05: 3.0, math.inf: 5.0}


def test_model_at_the_published_limits() -> None:
    model = FleetModel(nodes=5000, pods=150_000, groups=20_000)
    assert model.watches() == 300_000
    assert model.groups_hit_by_node_loss() == 30
    assert model.groups_hit_by_zone_loss() == 20_000
    assert model.burst_writes(30) == 90
    assert model.burst_events(20_000, 1 / 3) == pytest.approx(100_000)
    assert model.steady_changes_per_second() == pytest.approx(150_000 * 2 / 86_400)
    assert model.rocketmq_nameserver_per_second() == 10_000
    assert model.rocketmq_rebalance_per_second() == 15_000
    assert model.rocketmq_broker_per_second() == pytest.approx(150_000 * 3 / 30 + 15_000)
    small_groups = FleetModel(nodes=10, pods=40, groups=20)
    assert small_groups.groups_hit_by_zone_loss() == pytest.approx(20 / 3)


def test_kwok_bodies() -> None:
    node = node_body("n1", "zone-b")
    assert node["metadata"]["annotations"] == {FAKE_NODE_ANNOTATION: "fake"}
    assert node["metadata"]["labels"][ZONE_LABEL] == "zone-b"
    pod = pod_body("p", {"app": "x"}, "n1")
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["spec"]["tolerations"][0]["key"] == FAKE_NODE_ANNOTATION
