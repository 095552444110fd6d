"""Options shared by the whole test suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import pytest_timeout  # type: ignore[import-untyped]

from harness.polling import scaled

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run the long variants (marked slow): crash loops, large fuzz corpora",
    )


# Under pytest-xdist (`make test` runs two workers with --dist loadscope), the tests that share a
# costly session fixture run on one worker, so that it starts once; every other file is a scope of
# its own, so its module fixtures (an operator, a sidecar, a release build) start once too.
SHARED_SCOPES = {
    "tests/integration/rocketmq/": "rocketmq",  # RocketMQ's NameServer and two brokers: three JVMs
    "tests/oracle/": "java-oracle",  # RocketMQ's own client classes in a JVM
    "tests/spark/": "spark",  # the Spark session
    "tests/integration/operator/test_journal_replay.py": "spark",
}


def scope_of(nodeid: str) -> str:
    """The unit of work a test goes to a worker in: its shared scope, else its file."""
    for prefix, scope in SHARED_SCOPES.items():
        if nodeid.startswith(prefix):
            return scope
    return nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` with the scopes above (pytest-xdist's own ``loadgroup`` marks do not
    reach its scheduler under pytest 9)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class SharedFixtureScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long variant; run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool:
    """pytest-timeout's per-test limit (``timeout`` in pyproject.toml) is a backstop against a hung
    test, not a measure of one: stretch it like every wait (harness.polling: MQBALANCE_TIMEOUT_SCALE
    and the load average when the test starts), so a busy machine does not cut off a test whose own
    waits are still within their allowances."""
    stretched = settings._replace(timeout=scaled(settings.timeout))
    return bool(pytest_timeout.pytest_timeout_set_timer(item=item, settings=stretched))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One small local Spark session (``local[2]``, tests/spark_support.py) for every test that asks,
    in tests/spark and in the integration tests replaying the operator's journal: starting one takes
    seconds. Skips the test when pyspark (the 'replay' extra) is missing."""
    pytest.importorskip("pyspark", reason="the Spark tests need the 'replay' extra")
    from tests.spark_support import local_session

    session = local_session()
    yield session
    session.stop()
