"""The Java artifact as a team gets it: ``mvn install`` in a copy of clients/java outside the
repository, from an empty local Maven repository (everything from Maven Central), then an
application of its own — the README's dependency block beside its own rocketmq-client, and the
README's quick start as its code — builds against the installed artifact."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.kube.versions import K8S_VERSION_ENV
from harness.polling import scaled

JAVA = Path(__file__).resolve().parents[3] / "clients" / "java"
QUICK_START = (
    JAVA / "src" / "test" / "java" / "io" / "mqbalance" / "rocketmq" / "quickstart" / "QuickStart.java"
)

pytestmark = pytest.mark.skipif(
    os.environ.get(K8S_VERSION_ENV, "current") not in ("", "current"),
    reason="the Java artifact does not depend on Kubernetes: checked with the current release (make test)",
)

APP_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>example</groupId>
  <artifactId>orders-app</artifactId>
  <version>1.0</version>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencies>
    <dependency>
      <groupId>org.apache.rocketmq</groupId>
      <artifactId>rocketmq-client</artifactId>
      <version>5.3.3</version>
    </dependency>
{dependency}
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-compiler-plugin</artifactId>
        <version>3.13.0</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


def mvn(cwd: Path, repository: Path, *goals: str) -> None:
    result = subprocess.run(
        ["mvn", "-B", "-ntp", f"-Dmaven.repo.local={repository}", *goals],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=scaled(900),
        check=False,
    )
    assert result.returncode == 0, f"mvn {' '.join(goals)} in {cwd.name} failed:\n{result.stdout[-6000:]}"


def test_an_application_outside_the_repository_builds_against_the_installed_artifact(tmp_path: Path) -> None:
    repository = tmp_path / "m2"  # empty: what a new machine has
    module = tmp_path / "mqbalance-rocketmq"
    shutil.copytree(JAVA, module, ignore=shutil.ignore_patterns("target"))
    mvn(module, repository, "install")
    installed = repository / "io" / "mqbalance" / "mqbalance-rocketmq"
    (version,) = [p.name for p in installed.iterdir() if p.is_dir()]
    for suffix in ("", "-sources", "-javadoc"):
        assert (installed / version / f"mqbalance-rocketmq-{version}{suffix}.jar").is_file()

    readme = (JAVA / "README.md").read_text()
    dependency = re.search(r"```xml\n(<dependency>.*?</dependency>)\n```", readme, re.S)
    assert dependency is not None, "the README's quick start has no dependency block"
    app = tmp_path / "orders-app"
    source = app / "src" / "main" / "java" / "example"
    source.mkdir(parents=True)
    (app / "pom.xml").write_text(APP_POM.replace("{dependency}", dependency.group(1)))
    code = QUICK_START.read_text()
    code = re.sub(r"^package [\w.]+;", "package example;", code, count=1, flags=re.M)
    (source / "QuickStart.java").write_text(code)
    mvn(app, repository, "package")
    assert (app / "target" / "classes" / "example" / "QuickStart.class").is_file()
