"""The tests' own checkers, fed recorded histories with the defect each exists to catch: they must
fail on it (and pass on the same history without it), and say how much they checked.

No cluster: the generation watcher is driven by hand with what its watch would have delivered.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import pytest

from harness.e2e import Record, Score, journal_owners, score_variant
from mqbalance.contract import Ack, AssignmentDocument, Release
from mqbalance.journal import JournalRecord
from mqbalance.model import MessageModel, MessageQueue, StrategyName, StrategySpec
from tests.integration.invariants import check_document, check_journal, consumer_problems
from tests.integration.reliability.reliability_support import (
    GenerationWatcher,
    Published,
    handover_problems,
    release_problems,
    unexpected_errors,
)

NS = "ns"
GROUP = "g"
QUEUES = [MessageQueue("orders", "broker-a", i) for i in range(4)]
READABLE = {"orders": QUEUES}

VERSIONS = itertools.count(100)
"""resourceVersions: each write of a ConfigMap gets a new one."""

Share = Mapping[str, Sequence[int]]
"""Member -> queue ids of broker-a."""


def topics(share: Share) -> dict[str, dict[str, tuple[MessageQueue, ...]]]:
    return {"orders": {m: tuple(QUEUES[i] for i in ids) for m, ids in share.items()}}


def document(generation: int, share: Share, releasing: tuple[Release, ...] = ()) -> AssignmentDocument:
    return AssignmentDocument(
        group=GROUP,
        generation=generation,
        strategy="STICKY",
        message_model=MessageModel.CLUSTERING,
        computed_at=1.0,
        reason="test",
        members=dict.fromkeys(share, "zone-a"),
        topics=topics(share),
        releasing=releasing,
    )


def record(generation: int, share: Share) -> JournalRecord:
    return JournalRecord(
        namespace=NS,
        group=GROUP,
        generation=generation,
        time=float(generation),
        reason="test",
        strategy=StrategySpec(StrategyName.STICKY),
        message_model=MessageModel.CLUSTERING,
        members=dict.fromkeys(share, "zone-a"),
        broker_zones={"broker-a": "zone-a"},
        queues=READABLE,
        assignment=topics(share),
        moved=0,
        compute_seconds=0.0,
    )


def watcher(*seen: tuple[int, Share]) -> GenerationWatcher:
    """A watcher past its first listing (nothing published yet) that has then seen ``seen``, in order."""
    w = GenerationWatcher(None, NS, READABLE)
    w.listed([])
    for generation, share in seen:
        see(w, generation, share)
    return w


def see(
    w: GenerationWatcher, generation: int, share: Share, *, version: str = "", relisted: bool = False
) -> None:
    text = document(generation, share).encode()
    w.record(f"{GROUP}-assignment", version or f"rv{next(VERSIONS)}", text, relisted=relisted)


GOOD = [{"a": [0, 1, 2, 3]}, {"a": [0, 1], "b": [2, 3]}, {"a": [0, 1], "b": [2], "c": [3]}]


# -- the generation watcher --------------------------------------------------------------------------


def test_a_clean_history_passes_and_says_how_much_was_checked() -> None:
    w = watcher(*enumerate(GOOD, 1))
    see(w, 3, GOOD[2], version="rv3-annotated")  # a foreign rewrite of the same document
    figures = w.assert_clean(min_generations=3)
    assert (figures.generations_seen, figures.pairs_compared, figures.documents_read) == (3, 2, 4)
    assert (figures.outages, figures.gaps, figures.generations_from_journal) == (0, 0, 0)


def test_two_owners_in_one_generation_fail() -> None:
    w = watcher((1, {"a": [0, 1, 2], "b": [2, 3]}))
    with pytest.raises(AssertionError, match=r"assigned to both a and b"):
        w.assert_clean(min_generations=1)
    with pytest.raises(AssertionError, match="assigned to both"):
        check_document(document(1, {"a": [0, 1, 2], "b": [2, 3]}), READABLE)
    with pytest.raises(AssertionError, match="assigned to both"):
        check_journal([record(1, {"a": [0, 1, 2], "b": [2, 3]})])


def test_a_readable_queue_with_no_owner_fails() -> None:
    w = watcher((1, {"a": [0, 1], "b": [2]}))
    with pytest.raises(AssertionError, match="1 readable queues unassigned"):
        w.assert_clean(min_generations=1)
    with pytest.raises(AssertionError, match="unassigned"):
        check_document(document(1, {"a": [0, 1], "b": [2]}), READABLE)


def test_a_watch_that_saw_nothing_fails() -> None:
    w = watcher()
    with pytest.raises(AssertionError, match="checked 0 generations, fewer than the 1"):
        w.assert_clean(min_generations=1)


def test_fewer_generations_than_the_test_caused_fail() -> None:
    w = watcher((1, GOOD[0]), (2, GOOD[1]))
    with pytest.raises(AssertionError, match="checked 2 generations, fewer than the 3"):
        w.assert_clean(min_generations=3)


def test_a_generation_that_went_backwards_or_repeated_fails() -> None:
    w = watcher((1, GOOD[0]), (2, GOOD[1]), (1, GOOD[2]))
    with pytest.raises(AssertionError, match=r"went back or repeated: \[1, 2, 1\]"):
        w.assert_clean(min_generations=1)
    w = watcher((1, GOOD[0]), (1, GOOD[1]))  # another document under the same number: two writers
    with pytest.raises(AssertionError, match="went back or repeated"):
        w.assert_clean(min_generations=1)


def test_a_generation_missing_from_an_unbroken_watch_fails() -> None:
    w = watcher((1, GOOD[0]), (3, GOOD[2]))
    with pytest.raises(AssertionError, match="came after 1 in an unbroken watch"):
        w.assert_clean(min_generations=1, journal=[record(2, GOOD[1])])


def test_a_first_generation_after_1_fails_unless_it_was_there_before_the_watch() -> None:
    w = watcher((2, GOOD[1]))
    with pytest.raises(AssertionError, match="unbroken watch"):
        w.assert_clean(min_generations=1)
    w = GenerationWatcher(None, NS, READABLE)
    w.listed([(f"{GROUP}-assignment", "rv5", document(5, GOOD[1]).encode(), None)])
    see(w, 6, GOOD[2])
    assert w.assert_clean(min_generations=2).pairs_compared == 1


def test_a_gap_while_the_watch_was_away_is_closed_from_the_journal() -> None:
    w = watcher((1, GOOD[0]))
    w.failed(ConnectionRefusedError())
    w.failed(ConnectionRefusedError())  # one outage, however many failed requests
    w.listed([(f"{GROUP}-assignment", "rv4", document(4, GOOD[0]).encode(), None)])
    figures = w.assert_clean(
        min_generations=4, max_outages=1, journal=[record(2, GOOD[1]), record(3, GOOD[2])]
    )
    assert (figures.gaps, figures.generations_from_journal, figures.generations_seen) == (2, 2, 2)
    assert (figures.outages, figures.failed_requests, figures.relists, figures.pairs_compared) == (1, 2, 1, 3)
    assert [p.generation for p in w.history(GROUP)] == [1, 2, 3, 4]
    assert [p.source for p in w.history(GROUP)] == ["watch", "journal", "journal", "watch"]


def test_a_gap_missing_from_the_journal_fails() -> None:
    w = watcher((1, GOOD[0]))
    w.failed(ConnectionResetError())
    see(w, 3, GOOD[2], relisted=True)
    with pytest.raises(AssertionError, match="generation 2 was published while the watch was away"):
        w.assert_clean(min_generations=1, max_outages=1, journal=[])
    w = watcher((1, GOOD[0]))
    see(w, 3, GOOD[2], relisted=True)
    with pytest.raises(AssertionError, match="no journal was given"):
        w.assert_clean(min_generations=1)


def test_a_generation_read_from_the_journal_is_checked_too() -> None:
    w = watcher((1, GOOD[0]))
    see(w, 3, GOOD[2], relisted=True)
    with pytest.raises(AssertionError, match=r"generation 2: orders: .* assigned to both"):
        w.assert_clean(min_generations=1, journal=[record(2, {"a": [0, 1, 2], "b": [2, 3]})])


def test_more_outages_than_the_test_injected_fail() -> None:
    w = watcher((1, GOOD[0]))
    for _ in range(2):
        w.failed(TimeoutError())
        w.worked()
    with pytest.raises(AssertionError, match="the watch broke 2 times, more than the 1"):
        w.assert_clean(min_generations=1, max_outages=1)
    assert w.assert_clean(min_generations=1, max_outages=2).outages == 2


# -- across consecutive generations ------------------------------------------------------------------


def published(generation: int, share: Share) -> Published:
    return Published(GROUP, generation, topics(share), tuple(sorted(share)), (), "watch")


def test_a_queue_moved_straight_from_a_live_owner_to_another_member_is_caught() -> None:
    history = [published(1, {"a": [0, 1], "b": [2, 3]}), published(2, {"a": [0], "b": [2, 3], "c": [1]})]
    problems, pairs = handover_problems(history, departed=set())
    assert pairs == 1
    assert problems == [f"generation 2: {QUEUES[1]} went from a to c in one step"]
    # The same move from an owner that was deleted (or said ``all``) is no problem.
    assert handover_problems(history, departed={"a"}) == ([], 1)


def test_a_handover_through_a_revocation_passes_and_pairs_are_counted() -> None:
    history = [
        published(1, {"a": [0, 1], "b": [2, 3]}),
        published(2, {"a": [0], "b": [2, 3], "c": []}),  # 1 revoked from a, held by nobody
        published(3, {"a": [0], "b": [2, 3], "c": [1]}),
    ]
    assert handover_problems(history, departed=set()) == ([], 2)


def test_generations_that_are_not_consecutive_cannot_be_compared() -> None:
    history = [published(1, {"a": [0, 1, 2, 3]}), published(3, {"b": [0, 1, 2, 3]})]
    problems, pairs = handover_problems(history, departed=set())
    assert (problems, pairs) == (["generations 1 and 3 are not consecutive"], 0)


def revoking(acks: Mapping[str, Ack] | None) -> list[Published]:
    """Generation 2 revokes queue 1 from a and queue 3 from b for c; generation 3 gives both to c,
    published when the acknowledgements were ``acks``."""
    revoked = (Release("a", 2, 0.0, (QUEUES[1],)), Release("b", 2, 0.0, (QUEUES[3],)))
    return [
        published(1, {"a": [0, 1], "b": [2, 3]}),
        Published(GROUP, 2, topics({"a": [0], "b": [2], "c": []}), ("a", "b", "c"), revoked, "watch"),
        Published(
            GROUP, 3, topics({"a": [0], "b": [2], "c": [1, 3]}), ("a", "b", "c"), (), "watch", acks=acks
        ),
    ]


def test_a_revoked_queue_handed_on_at_another_owners_release_is_caught() -> None:
    # a released, b did not: handing b's queue on with a's is the defect.
    problems, checked = release_problems(revoking({"a": Ack(2, False), "b": Ack(1, False)}), set())
    assert checked == 2
    assert len(problems) == 1
    assert problems[0].startswith("generation 3: 1 queues revoked from b in generation 2 handed on before")
    # b gone (its pod deleted): its queues need no release.
    assert release_problems(revoking({"a": Ack(2, False)}), departed={"b"}) == ([], 1)


def test_queues_handed_on_after_their_owners_released_them_pass() -> None:
    both = {"a": Ack(2, False), "b": Ack(3, False)}
    assert release_problems(revoking(both), set()) == ([], 2)
    # "all" having seen the generation before the revocation releases it too (the contract's rule).
    assert release_problems(revoking({"a": Ack(2, False), "b": Ack(1, True)}), set()) == ([], 2)
    assert release_problems(revoking({"a": Ack(2, False), "b": Ack(0, True)}), set())[0] != []


def test_a_revocation_taken_back_hands_nothing_on() -> None:
    history = revoking({})
    back = Published(
        GROUP, 3, topics({"a": [0, 1], "b": [2, 3], "c": []}), ("a", "b", "c"), (), "watch", acks={}
    )
    assert release_problems([*history[:2], back], set()) == ([], 0)


def test_handed_on_queues_are_not_checked_without_the_acknowledgements() -> None:
    assert release_problems(revoking(None), set()) == ([], 0)


# -- logs -------------------------------------------------------------------------------------------

EXPECTED = {("mqbalance.kube.informer", r"watching \S+ failed; listing again in [\d.]+ s"): "a test reason"}
LOG = """\
2026-01-01 10:00:00,001 INFO mqbalance.operator.runtime: metrics and /healthz on port 1
2026-01-01 10:00:01,002 WARNING mqbalance.kube.informer: watching /api/v1/pods failed (HTTP 0: refused); listing again in 0.2 s
2026-01-01 10:00:02,003 ERROR mqbalance.kube.informer: watching /api/v1/pods failed; listing again in 0.4 s
Traceback (most recent call last):
  File "x.py", line 1, in <module>
ValueError: not JSON
2026-01-01 10:00:03,004 INFO mqbalance.operator.controller: published generation 2
"""  # noqa: E501


def test_an_expected_error_and_its_traceback_pass() -> None:
    assert unexpected_errors(LOG, EXPECTED) == []


def test_an_unexpected_traceback_in_a_log_is_caught() -> None:
    log = LOG + "Traceback (most recent call last):\n  File \"y.py\", line 2\nKeyError: 'x'\n"
    assert unexpected_errors(log, EXPECTED) == ["Traceback (most recent call last):"]
    # A traceback printed under an INFO or WARNING line is not explained by an expected ERROR.
    log = LOG.replace("ValueError: not JSON\n", "ValueError: not JSON\n" + LOG.splitlines()[0] + "\n")
    log += "Traceback (most recent call last):\nKeyError: 'y'\n"
    assert unexpected_errors(log, EXPECTED) == ["Traceback (most recent call last):"]


def test_an_unexpected_error_line_is_caught_even_if_it_mentions_the_outage() -> None:
    line = (
        "2026-01-01 10:00:04,005 ERROR mqbalance.operator.controller: reconcile failed (watch closed, retry)"
    )
    assert unexpected_errors(LOG + line + "\n", EXPECTED) == [line]
    # The expected message must match whole, and from its own logger.
    longer = "2026-01-01 10:00:05,6 ERROR mqbalance.kube.informer: watching /x failed; listing again in 1 s!"
    other = "2026-01-01 10:00:06,007 ERROR mqbalance.sidecar.app: watching /x failed; listing again in 1 s"
    assert unexpected_errors(f"{longer}\n{other}\n", EXPECTED) == [longer, other]
    assert unexpected_errors(LOG + line + "\n", {}) == [
        LOG.splitlines()[2],
        "Traceback (most recent call last):",
        line,
    ]


# -- who consumed what, end to end --------------------------------------------------------------------


def e2e_score(records: list[Record], journal: list[JournalRecord] | None) -> Score:
    produced = {(r[1], r[2], r[3]): (r[4], r[5], 0) for r in records}
    produced[("broker-a", 3, 0)] = ("k", 9, 0)  # every queue got a message
    score = score_variant("mqbalance" if journal is not None else "rocketmq", produced, records, 0.0)
    if journal is not None:
        score.owners = journal_owners(journal, GROUP, "orders")
    return score


def consumed(*who: tuple[int, str]) -> list[Record]:
    return [(10 * n, "broker-a", q, 0, "k", n, m) for n, (q, m) in enumerate(who)]


JOURNAL = [record(1, {"a": [0, 1, 2, 3]}), record(2, {"a": [0, 1], "b": [2, 3]})]


def test_every_queue_consumed_by_exactly_its_owners_passes() -> None:
    score = e2e_score(consumed((0, "a"), (1, "a"), (2, "a"), (2, "b"), (3, "b")), JOURNAL)
    assert score.consumers["broker-a:2"] == {"a", "b"}
    assert score.owners is not None
    assert score.owners["broker-a:2"] == {"a", "b"}
    assert consumer_problems(score) == []


def test_a_queue_nobody_consumed_is_caught() -> None:
    score = e2e_score(consumed((0, "a"), (1, "a"), (2, "b")), JOURNAL)
    assert consumer_problems(score) == ["mqbalance: nobody consumed broker-a:3"]
    assert consumer_problems(e2e_score(consumed((0, "x"), (1, "x"), (2, "y")), None)) == [
        "rocketmq: nobody consumed broker-a:3"
    ]


def test_a_queue_consumed_by_a_member_no_generation_named_is_caught() -> None:
    score = e2e_score(consumed((0, "a"), (1, "a"), (1, "c"), (2, "b"), (3, "b")), JOURNAL)
    assert consumer_problems(score) == ["mqbalance: broker-a:1 consumed by ['c'], never its owners"]


def test_an_error_in_another_format_is_caught() -> None:
    line = "ERROR:asyncio:Task exception was never retrieved"
    assert unexpected_errors(LOG + line + "\n", EXPECTED) == [line]
