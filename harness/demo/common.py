"""What both demos share (the stand-in in harness.demo, real pods in harness.demo.node): the error a
step that did not happen raises, the step line, and printing an assignment change and what a
sidecar serves.
"""

from __future__ import annotations

from typing import Any

from harness.demo import report as demo_report
from mqbalance.contract import AssignmentDocument
from mqbalance.model import MessageQueue


class DemoError(RuntimeError):
    """A step of the demo did not happen in time; the message says which."""


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


def show_change(before: AssignmentDocument, after: AssignmentDocument, notes: dict[str, str]) -> None:
    print()
    print(f"Assignment with {len(after.members)} members:")
    print(demo_report.assignment_table(after, notes))
    print()
    print(f"Moves from generation {before.generation} to {after.generation}:")
    print(demo_report.moves_table(demo_report.moves(before, after)))
    print(demo_report.summary(before, after))
    print()


def print_sidecar(view: dict[str, Any]) -> None:
    queues = [
        MessageQueue(topic, q["brokerName"], q["queueId"])
        for topic, items in view["queues"].items()
        for q in items
    ]
    print(
        f"Sidecar of {view['member']} serves generation {view['generation']} (GET /v1/queues): "
        f"{view['queueCount']} queue(s) {demo_report.compact_queues(queues)}"
    )
