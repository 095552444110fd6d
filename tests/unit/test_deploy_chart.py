"""The Helm chart's static properties: CRDs copied from crds/, every value documented and in the schema."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "mqbalance"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def test_chart_crds_are_exact_copies_of_crds() -> None:
    source = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    copies = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert source, "crds/ holds no CRDs"
    assert sorted(copies) == sorted(source), (
        "charts/mqbalance/crds/ and crds/ hold different files: run `make crds`"
    )
    stale = [name for name in source if copies[name] != source[name]]
    assert stale == [], f"charts/mqbalance/crds/ differs from crds/ in {stale}: run `make crds`"


def test_the_crds_stay_apart_when_helm_show_crds_joins_them() -> None:
    # `helm show crds` (the upgrade's first step, docs/deploy.md) prints the files one after the other
    # with no separator: without a leading `---` each, YAML reads them as one mapping whose repeated
    # keys keep the last file's, and kubectl applies only that CRD.
    files = sorted((CHART / "crds").glob("*.yaml"))
    joined = "".join(p.read_text() for p in files)
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(joined) if d]
    assert names == [yaml.safe_load(p.read_text())["metadata"]["name"] for p in files]


def _undocumented_values(text: str) -> list[str]:
    """Keys of values.yaml that neither carry a comment starting with their dotted key nor
    are a plain section whose every value does. A documented key covers what is under it
    (``resources:``, ``securityContext:`` are one value each)."""
    lines = text.splitlines()
    missing: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, dotted key, documented)
    for number, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stack and stack[-1][2]:
            continue  # inside a documented value
        dotted = f"{stack[-1][1]}.{match['key']}" if stack else match["key"]
        comment_start = number
        while comment_start > 0 and lines[comment_start - 1].strip().startswith("#"):
            comment_start -= 1
        first_comment = lines[comment_start].strip() if comment_start < number else ""
        documented = first_comment.startswith(f"# {dotted} --")
        is_section = match["rest"].strip() == "" and number + 1 < len(lines)
        if not documented and not is_section:
            missing.append(dotted)
        stack.append((indent, dotted, documented))
    return missing


def test_every_value_is_documented_by_a_comment_starting_with_its_key() -> None:
    assert _undocumented_values((CHART / "values.yaml").read_text()) == []


def test_the_documentation_check_notices_a_missing_comment() -> None:
    text = (
        "# a -- documented\na: 1\n"
        "section:\n  # section.b -- documented\n  b: 2\n  c: 3\n"
        "# wrong -- key\nd: 4\n"
    )
    assert _undocumented_values(text) == ["section.c", "d"]


def _leaf_paths(values: Any, prefix: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [p for key, value in values.items() for p in _leaf_paths(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def _schema_has(schema: dict[str, Any], path: str) -> bool:
    node = schema
    for part in path.split("."):
        props = node.get("properties", {})
        if part in props:
            node = props[part]
        else:
            # Only a free-form map (resources, affinity, labels) may hold keys the schema does not name.
            return node.get("type") == "object" and "properties" not in node
    return True


def test_every_value_is_in_the_schema_and_the_schema_names_no_missing_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert [p for p in _leaf_paths(values) if not _schema_has(schema, p)] == []

    def schema_leaves(node: dict[str, Any], prefix: str) -> list[str]:
        if "properties" not in node:
            return [prefix]
        return [
            leaf for key, sub in node["properties"].items() for leaf in schema_leaves(sub, f"{prefix}.{key}")
        ]

    def in_values(path: str) -> bool:
        node: Any = values
        for part in path.split(".")[1:]:
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    # "global" belongs to Helm (parent charts), not to our values.
    extra = [p for p in schema_leaves(schema, "") if not in_values(p) and p != ".global"]
    assert extra == []


@pytest.mark.parametrize("name", ["prometheus-rules.yaml", "grafana-dashboard.json"])
def test_monitoring_sources_live_in_the_chart_only(name: str) -> None:
    # One source of truth: the chart reads these with .Files.Get; nothing else may copy them.
    assert (CHART / "files" / name).is_file()
    stem = name.split(".")[0]
    copies = [
        p.relative_to(ROOT)
        for p in (ROOT / "deploy").rglob("*")
        if p.is_file() and stem.split("-")[-1] in p.name and not p.name.endswith("_test.yaml")
    ]
    assert copies == []


def test_templates_hold_one_resource_kind_each() -> None:
    kinds: dict[str, set[str]] = {}
    for path in (CHART / "templates").glob("*.yaml"):
        found = set(re.findall(r"^kind: (\w+)", path.read_text(), flags=re.MULTILINE))
        assert len(found) == 1, f"{path.name} declares {sorted(found)}; keep one resource kind per template"
        kinds[path.name] = found
    assert set().union(*kinds.values()) >= {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
    }


def test_docs_list_every_documented_value() -> None:
    text = (CHART / "values.yaml").read_text()
    documented = re.findall(r"^\s*# ([\w.]+) --", text, flags=re.MULTILINE)
    docs = (ROOT / "docs" / "deploy.md").read_text().split("\n## Values\n")[1].split("\n## ")[0]
    listed = set(re.findall(r"^\| `([\w.]+)` \|", docs, flags=re.MULTILINE))
    assert documented
    assert sorted(set(documented) - listed) == [], "add these values to the table in docs/deploy.md"
    assert sorted(listed - set(documented)) == [], "docs/deploy.md lists values the chart does not have"
