"""Real messages through the ways of balancing, while members join, leave and are SIGKILLed.

The short form of bench/bench_e2e_messages.py. Nothing the broker stored may be lost, by
RocketMQ's own rebalance or by mqbalance's operator + sidecars + SidecarPushConsumer; and with
the handover on, queues that move between live members (joins, clean leaves) are consumed
exactly once, and in order with orderly consumers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.e2e import Step, World, run, world
from tests.integration.invariants import consumer_problems


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
        # Every queue consumed, and (mqbalance) by exactly the owners its assignment named.
        problems = consumer_problems(score)
        assert not problems, "\n".join(problems)
    logs = list(Path(e2e_world.workdir).glob("*.tsv"))
    assert any("e2e-mqbalance" in p.name for p in logs)


def test_with_the_handover_moves_between_live_members_consume_each_message_once(e2e_world: World) -> None:
    script = (Step(0.2, "join", 3), Step(0.45, "leave", 0), Step(0.7, "join", 4))
    variants = ["mqbalance", "mqbalance-handover", "mqbalance-orderly"]
    scores = {
        s.variant: s
        for s in run(e2e_world, variants, seconds=30, rate=50, keys=16, script=script, tag="live")
    }
    produced = scores["mqbalance"].produced
    assert produced > 1000, f"the producer sent only {produced} messages"
    for score in scores.values():
        assert score.lost == 0, f"{score.variant} lost {score.lost} of {produced} messages"
        problems = consumer_problems(score)
        assert not problems, "\n".join(problems)
        # The script moved queues between live members, and their new owners consumed them.
        assert score.moves is not None
        assert score.moves.moves > 0, score
    for variant in ("mqbalance-handover", "mqbalance-orderly"):
        assert scores[variant].duplicates == 0, f"{variant}: {scores[variant].duplicates} duplicates"
        moves = scores[variant].moves
        assert moves is not None
        # A queue leaves a member that stays only once that member released it.
        assert moves.staying > 0, f"{variant}: no queue moved away from a member that stayed: {moves}"
        assert moves.staying_waited_min_s > 0, f"{variant}: a queue moved without its release: {moves}"
    assert scores["mqbalance-orderly"].order_violations == 0
    # Every revoked queue was released by its owner, none given away at the timeout.
    operator = e2e_world.operator
    assert operator is not None
    assert operator.metric("mqbalance_handover_assigned_queues_total", outcome="overridden") == 0
    assert operator.metric("mqbalance_handover_assigned_queues_total", outcome="released") > 0
