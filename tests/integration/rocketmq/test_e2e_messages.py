"""Real messages through both ways of balancing, while members join and one is SIGKILLed.

The short form of bench/bench_e2e_messages.py: nothing the broker stored may be lost, by either
RocketMQ's own rebalance or mqbalance's operator + sidecars + SidecarPushConsumer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.e2e import Step, World, run, world


@pytest.fixture(scope="module")
def e2e_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with world(tmp_path_factory.mktemp("e2e")) as w:
        yield w


def test_no_message_is_lost_by_either_variant(e2e_world: World) -> None:
    script = (Step(0.25, "join", 3), Step(0.5, "kill", 1))
    scores = run(e2e_world, ["rocketmq", "mqbalance"], seconds=20, rate=50, keys=16, script=script)
    produced = scores[0].produced
    assert produced > 500, f"the producer sent only {produced} messages"
    for score in scores:
        assert score.lost == 0, f"{score.variant} lost {score.lost} of {produced} messages"
        assert score.consumed >= produced
        # Every member wrote what it consumed; each queue was consumed by someone.
        assert score.gap_queue != "-"
    logs = list(Path(e2e_world.workdir).glob("*.tsv"))
    assert any("e2e-mqbalance" in p.name for p in logs)
