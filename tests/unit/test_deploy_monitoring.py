"""Prometheus rules and the Grafana dashboard query only metrics the code exports, and pass promtool;
every alert links to its runbook; both processes export build info and process metrics, no ``_created``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from harness.kube.versions import default_bin_dir
from mqbalance import buildinfo
from mqbalance.operator.metrics import Leadership, OperatorMetrics
from mqbalance.sidecar.metrics import SidecarMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "mqbalance" / "files" / "prometheus-rules.yaml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yaml"
DASHBOARD = ROOT / "charts" / "mqbalance" / "files" / "grafana-dashboard.json"
RULE_TEMPLATE = ROOT / "charts" / "mqbalance" / "templates" / "prometheusrule.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"

# The series names Prometheus stores for each metric type (no _created: both processes turn it off).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
}


def registries() -> tuple[OperatorMetrics, SidecarMetrics]:
    """The operator's and the sidecar's metrics, each on a registry of its own as the processes have them."""
    operator = OperatorMetrics(CollectorRegistry(), lambda: [])
    sidecar = SidecarMetrics(CollectorRegistry())
    sidecar.watch_brokers(lambda: [])
    return operator, sidecar


def exported_series() -> set[str]:
    """Every series name the operator and the sidecar can export, from their own registries."""
    operator, sidecar = registries()
    names: set[str] = set()
    for registry in (operator.registry, sidecar.registry):
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def recorded_names() -> set[str]:
    return {rule["record"] for group in rule_groups() for rule in group["rules"] if "record" in rule}


def rule_expressions() -> list[str]:
    return [rule["expr"] for group in rule_groups() for rule in group["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_expressions() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]


def series_names(expr: str) -> set[str]:
    """Metric and recording-rule names an expression selects (string literals, label matchers,
    grouping clauses, durations and functions left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    names = set()
    for match in re.finditer(r"(?<![\w:.$])[a-zA-Z_:][\w:]*", text):
        name, rest = match[0], text[match.end() :].lstrip()
        if rest.startswith("("):
            continue  # a function call
        if name not in PROMQL_KEYWORDS and not re.fullmatch(r"\d+[smhdwy]", name):
            names.add(name)
    return names


def unknown_series(expressions: list[str], known: set[str]) -> dict[str, set[str]]:
    found = {expr: series_names(expr) - known for expr in expressions}
    return {expr: names for expr, names in found.items() if names}


def github_anchors(markdown: str) -> set[str]:
    """The fragments GitHub gives headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*$", markdown, re.MULTILINE):
        text = re.sub(r"[^\w\- ]", "", match[1].lower())
        anchors.add(text.replace(" ", "-"))
    return anchors


def test_series_names_parses_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, group) (rate(a_bucket{group=~"$group", x="b_total"}[5m])))'
        " - c offset 10m"
    )
    assert series_names(expr) == {"a_bucket", "c"}
    assert series_names("x:y:rate5m > 10 and on (group) z == 0") == {"x:y:rate5m", "z"}


def test_exported_series_come_from_both_components() -> None:
    names = exported_series()
    assert "mqbalance_rebalances_total" in names
    assert "mqbalance_group_members" in names
    assert "mqbalance_sidecar_broker_available" in names
    assert "mqbalance_sidecar_propagation_delay_seconds_bucket" in names


def test_a_misspelt_metric_is_reported() -> None:
    assert unknown_series(["rate(mqbalance_rebalance_total[5m])"], exported_series()) == {
        "rate(mqbalance_rebalance_total[5m])": {"mqbalance_rebalance_total"}
    }


def test_rules_query_only_exported_metrics_and_their_own_recordings() -> None:
    assert unknown_series(rule_expressions(), exported_series() | recorded_names()) == {}


def test_dashboard_queries_only_exported_metrics() -> None:
    expressions = dashboard_expressions()
    assert expressions
    # The dashboard stands alone: it may not rely on recording rules being installed.
    assert unknown_series(expressions, exported_series()) == {}


def test_dashboard_shows_what_operators_need() -> None:
    queried = set().union(*(series_names(e) for e in dashboard_expressions()))
    wanted = {
        "mqbalance_rebalances_total",  # rebalances over time
        "mqbalance_queues_moved_total",  # moved queues
        "mqbalance_group_members",  # members
        "mqbalance_sidecar_owned_queues",  # load per consumer
        "mqbalance_group_cross_zone_queues",  # cross-zone queues
        "mqbalance_sidecar_propagation_delay_seconds_bucket",  # propagation delay
        "mqbalance_sidecar_broker_available",  # producer broker availability
        "mqbalance_member_lag",  # lag per member
    }
    assert wanted - queried == set()


def test_dashboard_is_well_formed_for_grafana() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "group"} <= variables
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"panel {panel['title']!r} is wider than the dashboard"
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel.get("description"), f"panel {panel['title']!r} has no description"


def test_alerts_requested_by_the_design_exist() -> None:
    alerts = {rule["alert"] for group in rule_groups() for rule in group["rules"] if "alert" in rule}
    assert {
        "MqbalanceRebalanceStorm",
        "MqbalanceGroupDegraded",
        "MqbalanceQueueUnassigned",
        "MqbalanceBrokerIsolated",
        "MqbalanceOperatorAbsent",
        "MqbalanceNoLeader",
        "MqbalanceLagGrowing",
    } <= alerts
    for group in rule_groups():
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
                assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def promtool() -> str:
    found = shutil.which("promtool") or (
        str(default_bin_dir() / "promtool") if os.access(default_bin_dir() / "promtool", os.X_OK) else None
    )
    if found is None:
        message = (
            "promtool is missing: run hack/build-control-plane.sh (it installs Debian's prometheus package)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_promtool_check_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", RULES_TEST.name],
        cwd=RULES_TEST.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_anchor_rule_matches_githubs() -> None:
    assert github_anchors("# Runbooks\n\n## MqbalanceNoLeader\n\ntext\n### Two `words`, here\n") == {
        "runbooks",
        "mqbalancenoleader",
        "two-words-here",
    }


def test_every_alert_links_to_its_section_of_the_runbooks() -> None:
    anchors = github_anchors(RUNBOOKS.read_text())
    # The chart swaps the document's URL (everything before "#") for metrics.prometheusRule.runbookUrl.
    (document,) = re.findall(r'replace "([^"]+#)"', RULE_TEMPLATE.read_text())
    for rule in alert_rules():
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith(document), (rule["alert"], url)
        fragment = url[len(document) :]
        assert fragment == rule["alert"].lower(), (rule["alert"], url)
        assert fragment in anchors, f"docs/runbooks.md has no section for {rule['alert']}"
    assert {a for a in anchors if a.startswith("mqbalance")} == {r["alert"].lower() for r in alert_rules()}


def test_every_alert_has_a_promtool_unit_test() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    }
    assert {rule["alert"] for rule in alert_rules()} - tested == set()


def test_both_processes_export_build_info_and_process_metrics() -> None:
    operator, sidecar = registries()
    for component, registry in (("operator", operator.registry), ("sidecar", sidecar.registry)):
        labels = {
            "component": component,
            "version": buildinfo.version(),
            "python_version": platform.python_version(),
            "python_implementation": platform.python_implementation(),
        }
        assert registry.get_sample_value("mqbalance_build_info", labels) == 1, component
        python = {
            "implementation": platform.python_implementation(),
            "major": str(sys.version_info.major),
            "minor": str(sys.version_info.minor),
            "patchlevel": str(sys.version_info.micro),
            "version": platform.python_version(),
        }
        assert registry.get_sample_value("python_info", python) == 1, component
        if sys.platform == "linux":
            assert (registry.get_sample_value("process_resident_memory_bytes") or 0) > 0, component
            assert registry.get_sample_value("process_cpu_seconds_total") is not None, component
            assert registry.get_sample_value("process_open_fds") is not None, component


def test_the_version_comes_from_the_installed_distribution() -> None:
    assert buildinfo.version() == importlib.metadata.version("mqbalance")


def test_no_created_series_in_either_exposition() -> None:
    operator, sidecar = registries()
    operator.rebalances.labels("member-joined").inc()
    operator.rebalance_duration.observe(0.01)
    sidecar.rebalances.labels("orders").inc()
    sidecar.propagation_delay.labels("orders").observe(0.02)
    for registry in (operator.registry, sidecar.registry):
        text = generate_latest(registry).decode()
        assert "mqbalance_rebalances" in text or "mqbalance_sidecar_rebalances" in text
        assert [line for line in text.splitlines() if "_created" in line] == []


def test_operator_exports_its_part_in_leader_election() -> None:
    operator, _ = registries()
    single = {"lease": ""}
    assert operator.registry.get_sample_value("mqbalance_operator_leader", single) == 1
    assert operator.registry.get_sample_value("mqbalance_operator_shards", single) == 1
    assert operator.registry.get_sample_value("mqbalance_operator_shards_held", single) == 1
    state = [Leadership("mq-operator", leader=False, shards=4, shards_held=2)]
    registry = CollectorRegistry()
    OperatorMetrics(registry, lambda: [], lambda: state[0])
    lease = {"lease": "mq-operator"}
    assert registry.get_sample_value("mqbalance_operator_leader", lease) == 0
    assert registry.get_sample_value("mqbalance_operator_shards", lease) == 4
    assert registry.get_sample_value("mqbalance_operator_shards_held", lease) == 2
    state[0] = Leadership("mq-operator", leader=False, shards=4, shards_held=3)  # read at every scrape
    assert registry.get_sample_value("mqbalance_operator_shards_held", lease) == 3
