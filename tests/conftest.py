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
