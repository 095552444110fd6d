"""`make release`'s artifacts (hack/release.sh --no-image): each one there, each carrying the
project's one version, the checksums right, the SBOMs naming what the image runs. The image
archive is checked where it is installed (the real node's tests)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from harness.kube.versions import K8S_VERSION_ENV

REPO = Path(__file__).resolve().parents[3]

# The artifacts do not depend on the Kubernetes release the suite runs against: built once, in `make test`.
pytestmark = pytest.mark.skipif(
    os.environ.get(K8S_VERSION_ENV, "current") not in ("", "current"),
    reason="the release artifacts are checked with the current Kubernetes release only (make test)",
)


def source_id() -> str:
    result = subprocess.run(
        ["bash", "hack/release.sh", "--print-source-id"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


SOURCE_BEFORE: list[str] = []
"""The tree's source id when the dist fixture began."""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    SOURCE_BEFORE.append(source_id())
    subprocess.run(
        ["bash", "hack/release.sh", "--no-image"],
        cwd=REPO,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()), "MQBALANCE_DIST": str(out)},
        check=True,
        capture_output=True,
        timeout=900,
    )
    return out


def version() -> str:
    text: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return text


def test_every_artifact_is_written_with_its_checksum(dist: Path) -> None:
    v = version()
    expected = {
        f"mqbalance-{v}-py3-none-any.whl",
        f"mqbalance-{v}.tar.gz",
        f"mqbalance-{v}.tgz",
        f"mqbalance-{v}.cdx.json",
        f"mqbalance-rocketmq-{v}.jar",
        f"mqbalance-rocketmq-{v}-sources.jar",
        f"mqbalance-rocketmq-{v}-javadoc.jar",
        f"mqbalance-rocketmq-{v}.pom",
        f"mqbalance-rocketmq-{v}.cdx.json",
        f"mqbalance-rocketmq-spring-boot-starter-{v}.jar",
        f"mqbalance-rocketmq-spring-boot-starter-{v}-sources.jar",
        f"mqbalance-rocketmq-spring-boot-starter-{v}-javadoc.jar",
        f"mqbalance-rocketmq-spring-boot-starter-{v}.pom",
        f"mqbalance-rocketmq-spring-boot-starter-{v}.cdx.json",
    }
    assert {p.name for p in dist.iterdir()} == expected | {"RELEASE", "SHA256SUMS"}
    sums: dict[str, str] = {}
    for line in (dist / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        sums[name] = digest
    assert set(sums) == expected | {"RELEASE"}
    for name, digest in sums.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name


def test_release_records_the_version_the_commit_and_the_sources(dist: Path) -> None:
    record = dict(line.split(" ", 1) for line in (dist / "RELEASE").read_text().splitlines())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    assert record["version"] == version()
    assert record["commit"] == head.stdout.strip()
    if source_id() != SOURCE_BEFORE[0]:
        pytest.skip("the sources changed while hack/release.sh ran: no one source id to compare with")
    assert record["source"] == SOURCE_BEFORE[0]


def test_the_wheel_the_chart_and_the_jar_carry_one_version(dist: Path) -> None:
    v = version()
    with zipfile.ZipFile(dist / f"mqbalance-{v}-py3-none-any.whl") as wheel:
        metadata = wheel.read(f"mqbalance-{v}.dist-info/METADATA").decode()
        assert f"\nVersion: {v}\n" in metadata
        assert f"mqbalance-{v}.dist-info/licenses/LICENSE" in wheel.namelist()
        assert "mqbalance/sidecar/openapi.json" in wheel.namelist()
    with tarfile.open(dist / f"mqbalance-{v}.tgz") as chart_archive:
        member = chart_archive.extractfile("mqbalance/Chart.yaml")
        assert member is not None
        chart = yaml.safe_load(member.read())
        names = chart_archive.getnames()
    assert (chart["version"], chart["appVersion"]) == (v, v)
    assert {"mqbalance/crds/mqbalance.io_consumergroups.yaml", "mqbalance/values.schema.json"} <= set(names)
    with zipfile.ZipFile(dist / f"mqbalance-rocketmq-{v}.jar") as jar:
        props = jar.read("META-INF/maven/io.mqbalance/mqbalance-rocketmq/pom.properties").decode()
        assert f"version={v}" in props.splitlines()
        assert any(n.endswith("SidecarPushConsumer.class") for n in jar.namelist())
    with zipfile.ZipFile(dist / f"mqbalance-rocketmq-{v}-sources.jar") as sources:
        assert any(n.endswith("SidecarPushConsumer.java") for n in sources.namelist())
    with zipfile.ZipFile(dist / f"mqbalance-rocketmq-spring-boot-starter-{v}.jar") as starter:
        name = "META-INF/maven/io.mqbalance/mqbalance-rocketmq-spring-boot-starter/pom.properties"
        assert f"version={v}" in starter.read(name).decode().splitlines()
        imports = "META-INF/spring/org.springframework.boot.autoconfigure.AutoConfiguration.imports"
        configuration = "io.mqbalance.rocketmq.spring.MqbalanceAutoConfiguration"
        assert starter.read(imports).decode().split() == [configuration]


def test_the_sboms_name_what_the_image_and_the_jar_depend_on(dist: Path) -> None:
    v = version()
    python = json.loads((dist / f"mqbalance-{v}.cdx.json").read_text())
    assert python["bomFormat"] == "CycloneDX"
    assert python["metadata"]["component"]["name"] == "mqbalance"
    assert python["metadata"]["component"]["version"] == v
    components = {c["name"].lower().replace("_", "-") for c in python["components"]}
    # the dependencies of the operator, the sidecar and the injector (the image's), not the replay's
    assert {"kopf", "aiohttp", "prometheus-client", "cryptography"} <= components
    assert "pyspark" not in components
    java = json.loads((dist / f"mqbalance-rocketmq-{v}.cdx.json").read_text())
    assert java["metadata"]["component"]["version"] == v
    assert any(c["name"] == "rocketmq-client" for c in java["components"])
    starter = json.loads((dist / f"mqbalance-rocketmq-spring-boot-starter-{v}.cdx.json").read_text())
    assert starter["metadata"]["component"]["version"] == v
    names = {c["name"] for c in starter["components"]}
    assert {"mqbalance-rocketmq", "rocketmq-spring-boot-starter"} <= names
