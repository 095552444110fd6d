"""Fixtures of the differential tests: RocketMQ's answers to every scenario, one JVM per version."""

from __future__ import annotations

import pytest

from tests.oracle.runner import JavaOracle, build, versions
from tests.oracle.scenarios import Scenarios, all_scenarios


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/oracle/" in item.path.as_posix():
            item.add_marker(pytest.mark.java)


@pytest.fixture(scope="session")
def scenarios() -> Scenarios:
    return all_scenarios()


@pytest.fixture(scope="session")
def rocketmq(scenarios: Scenarios) -> dict[str, dict[str, list[list[str]]]]:
    """version -> scenario kind -> each script's output, as RocketMQ's classes answer."""
    wanted = versions()
    classes, classpaths = build(wanted)
    answers: dict[str, dict[str, list[list[str]]]] = {}
    for version in wanted:
        kinds = scenarios.for_version(version)
        flat = [script for kind in kinds for script in kinds[kind]]
        outputs = iter(JavaOracle(version, classes, classpaths[version]).run(flat))
        answers[version] = {kind: [next(outputs) for _ in kinds[kind]] for kind in kinds}
    return answers
