"""mqbalance's producer against RocketMQ's own classes, scenario by scenario (see tests/oracle/script.py)."""

from __future__ import annotations

import pytest

from tests.oracle.scenarios import DOCUMENTED, DOCUMENTED_MODE, EXACT, MODE_FOLLOWS, Scenarios, generation_of
from tests.oracle.script import run_model

CASES = [(kind, version) for kind, where in EXACT.items() for version in where]


def first_difference(script: list[str], java: list[str], model: list[str]) -> str:
    """The script up to the first answer that differs, with both answers."""
    shown: list[str] = []
    answers = 0
    for line in script:
        shown.append(line)
        # Lines that print: queries. Count them to find the one that differs.
        if line.split(" ")[0] in {
            "SELECT",
            "AVAIL",
            "REACH",
            "PICK",
            "ORDER",
            "ITEM",
            "QUEUES",
            "IDX",
            "KEYS",
            "TABLE",
            "HASH",
        }:
            if answers >= len(java) or answers >= len(model) or java[answers] != model[answers]:
                got_java = java[answers] if answers < len(java) else "<none>"
                got_model = model[answers] if answers < len(model) else "<none>"
                return "\n".join(shown) + f"\n  RocketMQ: {got_java}\n  mqbalance: {got_model}"
            answers += 1
    return "\n".join(shown)


@pytest.mark.parametrize(("kind", "version"), CASES, ids=[f"{k}-{v}" for k, v in CASES])
def test_answers_as_rocketmq_does(
    kind: str, version: str, scenarios: Scenarios, rocketmq: dict[str, dict[str, list[list[str]]]]
) -> None:
    scripts = scenarios.scripts[kind]
    java_outputs = rocketmq[version][kind]
    for script, java in zip(scripts, java_outputs, strict=True):
        model = run_model(script, generation_of(kind))[:-1]  # its END
        assert model == java, f"RocketMQ {version}, {kind} scenario:\n" + first_difference(
            script, java, model
        )


DIFFERENCES = [(kind, version) for kind, (_, answers) in DOCUMENTED.items() for version in answers]


@pytest.mark.parametrize(("kind", "version"), DIFFERENCES, ids=[f"{k}-{v}" for k, v in DIFFERENCES])
def test_the_documented_differences_between_versions(
    kind: str, version: str, rocketmq: dict[str, dict[str, list[list[str]]]]
) -> None:
    script, answers = DOCUMENTED[kind]
    assert rocketmq[version][kind] == [answers[version]]
    # The mode answers as the version it follows.
    assert run_model(script, DOCUMENTED_MODE[kind])[:-1] == answers[MODE_FOLLOWS[kind]]
