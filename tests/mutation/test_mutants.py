"""Mutation runs: each mutant of ``mutants.py`` must make every test named for its property fail.

For each mutant this runs the tests it names in a pytest subprocess with ``$MQBALANCE_TEST_MUTANT``
set, so every operator those tests start is the broken one, and asserts each of them failed (a
failed assertion or wait, not an error in a fixture, nor the operator dying). A control runs the
same tests with the unmutated operator first: they must pass, or a failure under a mutant would
prove nothing. Marked ``mutation``, which the default run deselects; run them with

    .venv/bin/pytest -m mutation tests/mutation

Each subprocess starts its own local control plane (docs/local-cluster.md). docs/reliability.md,
"Mutation runs", lists the mutants, the tests that catch them and how long the runs take.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.apps.argv import MUTANT_ENV
from tests.mutation.mutants import MUTANTS

pytestmark = pytest.mark.mutation

REPO = Path(__file__).resolve().parents[2]
OPERATOR_DIED = ("ProcessExited", "the operator exited with code")
"""A failure saying so is the mutant crashing the operator, not a test catching the broken property."""


@dataclass(frozen=True)
class Outcome:
    node_id: str
    result: str
    """passed, failed, error or skipped (failed: the test itself failed; error: a fixture did)."""
    seconds: float
    message: str


@dataclass(frozen=True)
class Run:
    outcomes: dict[str, Outcome]
    seconds: float
    log: Path

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _node_id(case: ET.Element) -> str:
    path = case.get("classname", "").replace(".", "/") + ".py"
    return f"{path}::{case.get('name', '')}"


def _outcomes(junit: Path) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        result = "failed" if failure is not None else "error" if error is not None else "passed"
        if skipped is not None and result == "passed":
            result = "skipped"
        detail = failure if failure is not None else error
        message = "" if detail is None else f"{detail.get('message', '')}\n{detail.text or ''}"
        out[_node_id(case)] = Outcome(_node_id(case), result, float(case.get("time", 0)), message)
    return out


def run_tests(node_ids: Sequence[str], mutant: str | None, workdir: Path) -> Run:
    """Run ``node_ids`` in a pytest subprocess, with the operator mutated by ``mutant`` (or not)."""
    env = {k: v for k, v in os.environ.items() if k != MUTANT_ENV}
    if mutant is not None:
        env[MUTANT_ENV] = mutant
    junit, log = workdir / "junit.xml", workdir / "pytest.log"
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *node_ids]
    started = time.monotonic()
    with open(log, "wb") as out:
        subprocess.run(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    seconds = time.monotonic() - started
    outcomes = _outcomes(junit) if junit.exists() else {}
    return Run(outcomes, seconds, log)


def _report(title: str, run: Run) -> None:
    print(f"\n{title} ({run.seconds:.0f} s):")
    for outcome in run.outcomes.values():
        print(f"  {outcome.result:7} {outcome.seconds:6.1f} s  {outcome.node_id}")
        why = outcome.message.strip().splitlines()
        if why:
            print(f"          {why[0][:200]}")


def all_named_tests() -> list[str]:
    return sorted({node_id for m in MUTANTS.values() for node_id in m.caught_by})


def test_the_named_tests_pass_with_the_real_operator(tmp_path: Path) -> None:
    """The control: without a mutant every test a mutant names passes."""
    named = all_named_tests()
    run = run_tests(named, None, tmp_path)
    _report("unmutated operator", run)
    wrong = {n: run.outcomes[n].result if n in run.outcomes else "not run" for n in named}
    wrong = {n: r for n, r in wrong.items() if r != "passed"}
    assert not wrong, f"with the real operator: {wrong}\n{run.tail()}"


@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_tests_named_for_a_property_catch_its_mutant(name: str, tmp_path: Path) -> None:
    mutant = MUTANTS[name]
    run = run_tests(mutant.caught_by, name, tmp_path)
    _report(f"mutant {name}: {mutant.breaks}", run)
    missed = []
    for node_id in mutant.caught_by:
        outcome = run.outcomes.get(node_id)
        if outcome is None:
            missed.append(f"{node_id}: not run")
        elif outcome.result != "failed":
            missed.append(f"{node_id}: {outcome.result}")
        elif any(sign in outcome.message for sign in OPERATOR_DIED):
            missed.append(f"{node_id}: failed only because the mutant operator died")
    listed = "\n".join(missed)
    assert not missed, f"mutant {name} ({mutant.breaks}) not caught:\n{listed}\n{run.tail()}"
