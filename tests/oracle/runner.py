"""Runs scripts on RocketMQ's own classes: one JVM per rocketmq-client version, scripts batched.

``hack/build-java-oracle.sh`` resolves each version from Maven Central and compiles the driver
(cached in ~/.cache/mqbalance/java-oracle); a failure there fails the tests with its output.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from harness.polling import scaled

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "hack" / "build-java-oracle.sh"
VERSIONS_FILE = Path(__file__).resolve().parent / "versions.txt"


def versions() -> list[str]:
    """The rocketmq-client versions the differential tests run (tests/oracle/versions.txt)."""
    lines = VERSIONS_FILE.read_text().splitlines()
    return [v.split("#")[0].strip() for v in lines if v.split("#")[0].strip()]


class OracleError(RuntimeError):
    """The oracle could not be built or run; the message carries its output."""


def build(wanted: Sequence[str]) -> tuple[Path, dict[str, str]]:
    """The driver's class directory and each version's classpath."""
    done = subprocess.run(
        ["bash", str(BUILD), *wanted], capture_output=True, text=True, check=False, timeout=scaled(1800)
    )
    if done.returncode != 0:
        raise OracleError(f"{BUILD.name} failed ({done.returncode}):\n{done.stderr[-6000:]}")
    classes: Path | None = None
    classpaths: dict[str, str] = {}
    for line in done.stdout.splitlines():
        name, _, value = line.partition("\t")
        if name == "classes":
            classes = Path(value)
        else:
            classpaths[name] = value
    if classes is None or set(classpaths) != set(wanted):
        raise OracleError(f"{BUILD.name} printed no classes dir or not every classpath:\n{done.stdout}")
    return classes, classpaths


class JavaOracle:
    """RocketMQ ``version``'s answers to scripts (each script ends with ``END``)."""

    def __init__(self, version: str, classes: Path, classpath: str) -> None:
        java = shutil.which("java")
        if java is None:
            raise OracleError("no java on PATH (hack/build-java-oracle.sh installs one when run as root)")
        self.version = version
        self._command = [
            java,
            "-Xshare:auto",
            "-XX:TieredStopAtLevel=1",
            "--add-opens",
            "java.base/java.util.concurrent=ALL-UNNAMED",
            "-cp",
            str(classes),
            "Oracle",
            classpath,
        ]

    def run(self, scripts: Sequence[Sequence[str]]) -> list[list[str]]:
        """Every script's output lines (its ``END`` left off), from one JVM."""
        text = "".join(line + "\n" for script in scripts for line in script)
        done = subprocess.run(
            self._command, input=text, capture_output=True, text=True, timeout=scaled(600), check=False
        )
        if done.returncode != 0:
            raise OracleError(
                f"the oracle for RocketMQ {self.version} exited {done.returncode}:\n{done.stderr}"
            )
        outputs: list[list[str]] = [[]]
        for line in done.stdout.splitlines():
            if line == "END":
                outputs.append([])
            else:
                outputs[-1].append(line)
        outputs.pop()
        if len(outputs) != len(scripts):
            counts = f"{len(outputs)} outputs for {len(scripts)} scripts"
            raise OracleError(f"RocketMQ {self.version}: {counts}\n{done.stderr[-4000:]}")
        return outputs
