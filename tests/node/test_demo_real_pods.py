"""The demo (`make demo`) on real pods: the chart installed, consumers scaled 3 -> 5 -> 4, every pod's
own sidecar shown, the node torn down.

Runs before the session's node (this file sorts first): one node runs per machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.node import host
from harness.node.images import Images
from harness.node.specs import NODE_IP
from tests.integration.test_demo import group_row, run_demo, section

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_output(images: Images) -> str:
    return run_demo("real", 900)


def test_demo_says_it_runs_on_real_pods(demo_output: str) -> None:
    assert demo_output.splitlines()[0].startswith("==> mode: real pods")
    assert "==> helm install mqbalance charts/mqbalance (local image, imagePullPolicy Never)" in demo_output


def test_demo_shows_each_assignment_and_every_pods_sidecar(demo_output: str) -> None:
    lines = demo_output.splitlines()
    tables = [line for line in lines if re.fullmatch(r"Assignment with \d+ members.*:", line)]
    assert [int(t.split()[2]) for t in tables] == [3, 5, 4]
    for title in tables:
        rows = section(demo_output, title)
        generation = int(rows[0].split()[1])
        members = [row.split()[0] for row in rows[2:]]
        loads = [int(row.split()[2]) for row in rows[2:]]
        assert sum(loads) == 12  # examples/topic.yaml: 3 brokers x 4 queues
        assert max(loads) - min(loads) <= 1
        # Each member's own sidecar, asked inside its pod, serves that generation and its row's queues.
        for member, row in zip(members, rows[2:], strict=True):
            line = next(
                x for x in lines if x.startswith(f"Sidecar of {member} serves generation {generation} ")
            )
            held = row.split(maxsplit=4)[4].split("  ")[0].strip()
            assert line.endswith(held), (line, held)


def test_demo_moves_add_up(demo_output: str) -> None:
    titles = [line for line in demo_output.splitlines() if line.startswith("Moves from generation")]
    assert len(titles) == 2
    for title in titles:
        table = section(demo_output, title)
        moved = int(re.search(r"(\d+) queue\(s\) moved", table[-1])[1])  # type: ignore[index]
        minimum = int(re.search(r"allows is (\d+)", table[-1])[1])  # type: ignore[index]
        assert len(table) - 2 == moved
        # The minimum is that of any balanced assignment, zones aside: with the pods spread over
        # three zones the example group's zoneAffinity may move more to keep queues in their
        # broker's zone (tests/integration/test_demo.py says the same of the stand-in).
        assert minimum <= moved <= 12


def test_demo_prints_the_group_and_tears_the_node_down(demo_output: str) -> None:
    lines = demo_output.splitlines()
    assert group_row(lines) == ["orders-consumer", "STICKY", "4"]
    assert "==> tearing the node down (pods, containerd, iptables rules, bridge, mounts)" in lines
    assert lines[-1].startswith("==> done in ")
    assert host.leftovers(NODE_IP) == []
