"""Options shared by the whole test suite."""

from __future__ import annotations

import pytest


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
