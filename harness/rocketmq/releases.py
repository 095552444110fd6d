"""The RocketMQ releases the harness runs, and their jars: fetched once by ``hack/build-rocketmq.sh``
into the per-user cache (``~/.cache/mqbalance/rocketmq-<version>/lib``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.paths import REPO, cache_dir

DEFAULT_VERSION = "5.3.3"
"""The pinned 5.x release (also in hack/build-rocketmq.sh)."""
LEGACY_VERSION = "4.9.7"
"""The 4.x release that Maven Central serves whole (4.9.8's namesrv and broker jars are not there)."""
CURRENT_VERSION = "5.5.0"
"""The current line: the newest release whose NameServer, Broker, client and admin tools Maven
Central serves whole (of 5.5.1 it serves rocketmq-tiered-store and rocketmq-broker, not
rocketmq-namesrv, rocketmq-client nor rocketmq-tools)."""
LINES = (CURRENT_VERSION, DEFAULT_VERSION, LEGACY_VERSION)
"""Every release the RocketMQ suites run against (docs/rocketmq.md, "Releases")."""
VERSION_ENV = "MQBALANCE_ROCKETMQ_VERSION"


def version_under_test() -> str:
    """The release the RocketMQ suites (the route and lag readers, the end-to-end messages) run
    against: ``$MQBALANCE_ROCKETMQ_VERSION`` (one of :data:`LINES`), else the current line, which
    CI runs; ``make test-rocketmq-lines`` runs them with the others."""
    version = os.environ.get(VERSION_ENV, "").strip() or CURRENT_VERSION
    if version not in LINES:
        raise ValueError(f"{VERSION_ENV}={version!r}: not one of the tested releases {', '.join(LINES)}")
    return version


def is_5x(version: str) -> bool:
    return int(version.split(".")[0]) >= 5


BUILD_SCRIPT = REPO / "hack" / "build-rocketmq.sh"


class RocketMQError(RuntimeError):
    """RocketMQ could not be fetched, started or reached; the message carries the logs."""


class MqadminError(RocketMQError):
    """An ``mqadmin`` command failed: a refusal, or a request that timed out on a loaded machine."""


def home(version: str = DEFAULT_VERSION) -> Path:
    return cache_dir() / f"rocketmq-{version}"


def lib_dir(version: str = DEFAULT_VERSION) -> Path:
    return home(version) / "lib"


def jars_present(version: str = DEFAULT_VERSION) -> bool:
    lib = lib_dir(version)
    return (home(version) / ".stamp").is_file() and (lib / f"rocketmq-broker-{version}.jar").is_file()


def ensure_jars(version: str = DEFAULT_VERSION) -> Path:
    """The lib dir of ``version``, fetching it first (once, cached) when missing."""
    if jars_present(version):
        return lib_dir(version)
    print(f"fetching RocketMQ {version} with {BUILD_SCRIPT} (once; cached)", file=sys.stderr)
    result = subprocess.run(["bash", str(BUILD_SCRIPT), version], stdout=subprocess.PIPE, check=False)
    if result.returncode != 0 or not jars_present(version):
        raise RocketMQError(f"{BUILD_SCRIPT} {version} failed with exit code {result.returncode}")
    return lib_dir(version)
