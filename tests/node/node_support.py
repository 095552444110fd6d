"""Assertions of the real-pod tests; the workload helpers are in harness/node/workload.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from harness.node.cluster import RealNode
from harness.node.workload import EXAMPLES, assignment, save_journal, sidecar_view
from harness.polling import wait_for
from mqbalance.contract import AssignmentDocument, read_topic
from mqbalance.model import MessageQueue


def example_readable() -> dict[str, list[MessageQueue]]:
    """The readable queues of examples/topic.yaml, the Topic the node tests' group subscribes."""
    topic = yaml.safe_load((EXAMPLES / "topic.yaml").read_text())
    name = topic["spec"].get("topicName") or topic["metadata"]["name"]
    return {name: read_topic(name, topic["spec"]).readable_queues()}


def queues_of_view(view: dict[str, Any]) -> dict[str, set[tuple[str, int]]]:
    return {
        topic: {(q["brokerName"], int(q["queueId"])) for q in qs}
        for topic, qs in view["queues"].items()
        if qs
    }


def queues_of_document(doc: AssignmentDocument, member: str) -> dict[str, set[tuple[str, int]]]:
    return {
        topic: {(q.broker_name, q.queue_id) for q in qs} for topic, qs in doc.queues_of(member).items() if qs
    }


def check_each_sidecar(node: RealNode, doc: AssignmentDocument, timeout: float = 60) -> None:
    """Every member's own sidecar serves exactly that member's queues of ``doc`` (or a later generation)."""
    for member in sorted(doc.members):

        def served(member: str = member) -> dict[str, Any] | None:
            view = sidecar_view(node, member)
            return view if int(view["generation"]) >= doc.generation else None

        view = wait_for(f"{member}'s sidecar serving generation {doc.generation}", served, timeout, 0.5)
        current = doc if int(view["generation"]) == doc.generation else assignment(node)
        assert current is not None
        assert view["isMember"] is True, view
        assert queues_of_view(view) == queues_of_document(current, member), (member, view)


KEEP_JOURNAL = "MQBALANCE_KEEP_JOURNAL"
"""A directory where tests that ask for it keep the operator's journal (``make test-chaos``)."""


def keep_journal(node: RealNode, name: str) -> None:
    """Keep the operator's log as ``$MQBALANCE_KEEP_JOURNAL/<name>.log`` when the variable is set,
    for ``mqbalance replay --journal`` (docs/pipeline.md, "Real journals")."""
    directory = os.environ.get(KEEP_JOURNAL)
    if directory:
        records = save_journal(node, Path(directory) / f"{name}.log")
        print(f"the operator's journal ({records} records) kept in {directory}/{name}.log")
