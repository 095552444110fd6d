"""One version for the wheel, the package, the chart, the image the examples name and the Java artifact."""

from __future__ import annotations

import re
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

import mqbalance

REPO = Path(__file__).resolve().parents[2]
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def project_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def test_the_package_the_chart_and_the_java_artifact_carry_the_project_version() -> None:
    version = project_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    chart = yaml.safe_load((REPO / "charts/mqbalance/Chart.yaml").read_text())
    pom = ET.parse(REPO / "clients/java/pom.xml").getroot()
    found = {
        "mqbalance.__version__": mqbalance.__version__,
        "Chart.yaml version": chart["version"],
        "Chart.yaml appVersion": chart["appVersion"],
        "clients/java/pom.xml": pom.findtext("m:version", namespaces=POM_NS),
    }
    assert found == dict.fromkeys(found, version)


def test_the_examples_and_docs_name_the_image_of_this_version() -> None:
    version = project_version()
    for path in ("examples/consumer-deployment.yaml", "Dockerfile", "clients/java/README.md"):
        text = (REPO / path).read_text()
        named = set(re.findall(r"mqbalance/mqbalance:(\d+\.\d+\.\d+)", text))
        named |= set(re.findall(r"<artifactId>mqbalance-rocketmq</artifactId>\s*<version>([^<]+)<", text))
        assert named == {version}, f"{path} names {sorted(named)}, the project is {version}"


def test_the_image_label_carries_the_project_version() -> None:
    labels = re.findall(r'org\.opencontainers\.image\.version="([^"]+)"', (REPO / "Dockerfile").read_text())
    assert labels == [project_version()]


def test_the_install_and_upgrade_steps_name_the_release_files_of_this_version() -> None:
    # README's "Install on a cluster" and docs/deploy.md's "Upgrading" run as written on a real node.
    version = project_version()
    for path in ("README.md", "docs/deploy.md"):
        text = (REPO / path).read_text()
        named = set(re.findall(r"mqbalance-(?:image-)?(\d+\.\d+\.\d+)\.(?:oci\.tar|tgz)\b", text))
        assert named == {version}, (
            f"{path} names the release files of {sorted(named)}, the project is {version}"
        )
