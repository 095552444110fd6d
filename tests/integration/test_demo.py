"""The demo (`make demo`) runs end to end and shows the assignments, the moves and what the sidecar serves.

This is the stand-in mode (pods acted out); tests/node/test_demo_real_pods.py runs it on real pods.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.polling import scaled

REPO = Path(__file__).resolve().parents[2]


def run_demo(mode: str, allowance: float) -> str:
    """``python -m harness.demo --mode MODE``'s output, once it succeeded within ``allowance``."""
    result = subprocess.run(
        [sys.executable, "-m", "harness.demo", "--mode", mode, "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=scaled(allowance),  # the demo's own waits (--timeout 60 each) scale the same way
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def demo_output() -> str:
    return run_demo("stand-in", 300)


def section(output: str, title: str) -> list[str]:
    """The lines after ``title`` up to the next blank line."""
    lines = output.splitlines()
    start = lines.index(title) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def test_demo_shows_each_assignment_as_a_table(demo_output: str) -> None:
    for members in (3, 5, 4):
        rows = section(demo_output, f"Assignment with {members} members:")
        assert rows[0].startswith("generation ")
        assert rows[1].split()[:5] == ["MEMBER", "ZONE", "QUEUES", "CROSS-ZONE", "HELD"]
        loads = [int(row.split()[2]) for row in rows[2:]]
        assert len(loads) == members
        assert sum(loads) == 12  # examples/topic.yaml: 3 brokers x 4 queues
        assert max(loads) - min(loads) <= 1  # STICKY keeps loads within one


def test_demo_lists_the_moves_and_they_add_up(demo_output: str) -> None:
    titles = [line for line in demo_output.splitlines() if line.startswith("Moves from generation")]
    assert len(titles) == 2
    scale_up, scale_down = (section(demo_output, title) for title in titles)
    for table in (scale_up, scale_down):
        assert table[0].split() == ["QUEUE", "FROM", "TO"]
        moves = [row.split() for row in table[1:-1]]
        summary = table[-1]
        moved = int(re.search(r"(\d+) queue\(s\) moved", summary)[1])  # type: ignore[index]
        minimum = int(re.search(r"allows is (\d+)", summary)[1])  # type: ignore[index]
        assert len(moves) == moved
        # The minimum is that of any balanced assignment, zones aside: the example group's zoneAffinity
        # may move more to keep queues in their broker's zone, and how many depends on whether the
        # operator saw the two new pods in one generation or two (debounceSeconds: 0). STICKY's exact
        # minimum, with and without zones, is the property tests' (tests/unit/test_sticky*.py).
        assert minimum <= moved
    # Scaling down deleted orders-consumer-1: every queue it held moved (forced), to the remaining pods.
    forced = int(re.search(r"\((\d+) forced", scale_down[-1])[1])  # type: ignore[index]
    from_gone = [row for row in scale_down[1:-1] if row.split()[1] == "orders-consumer-1"]
    assert forced == len(from_gone) > 0
    assert all(row.split()[2] != "orders-consumer-1" for row in scale_down[1:-1])
    # Scaling up: queues moved only to the new pods.
    assert {row.split()[2] for row in scale_up[1:-1]} <= {"orders-consumer-3", "orders-consumer-4"}


def test_demo_shows_what_the_sidecar_serves(demo_output: str) -> None:
    served = [
        line for line in demo_output.splitlines() if line.startswith("Sidecar of orders-consumer-0 serves")
    ]
    assert len(served) == 3
    generations = [int(re.search(r"generation (\d+)", line)[1]) for line in served]  # type: ignore[index]
    assert generations == sorted(generations)
    assert len(set(generations)) == 3


def group_row(lines: list[str]) -> list[str]:
    """NAME, STRATEGY and MEMBERS of the first row of ``kubectl get consumergroups`` in the output."""
    header = next(i for i, line in enumerate(lines) if line.startswith("NAME ") and "STRATEGY" in line)
    return lines[header + 1].split()[:3]


def test_demo_prints_the_consumer_groups_and_stops(demo_output: str) -> None:
    lines = demo_output.splitlines()
    assert group_row(lines) == ["orders-consumer", "STICKY", "4"]
    assert "==> stopping the sidecar, the operator and the control plane" in lines
    assert lines[-1].startswith("==> done in ")
