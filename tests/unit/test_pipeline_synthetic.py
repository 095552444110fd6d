"""Synthetic churn: deterministic per group, one change per event as the mix says."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json

import pytest

from mqbalance.pipeline import synthetic


def test_same_seed_same_history_different_seed_different_history() -> None:
    # Pinned to the values this seed has always given: the same history in every process (no hash
    # randomization) and every release, or recorded what-if replays would no longer reproduce.
    churn = synthetic.Churn(groups=3, events_per_group=30, seed=11)
    history = list(synthetic.events(churn))
    group1 = [e for e in history if e.group == "group-0000001"]
    assert [e.reason for e in group1[:10]] == [
        "initial", "join", "queues", "leave", "join", "queues", "leave", "zone", "leave", "leave",
    ]  # fmt: skip
    assert (group1[9].time, group1[9].members) == (
        1700000186.202,
        {
            "group-0000001-0001": "zone-0",
            "group-0000001-0003": "zone-0",
            "group-0000001-0005": "zone-0",
            "group-0000001-0007": "zone-1",
            "group-0000001-0008": "zone-0",
            "group-0000001-0009": "zone-2",
        },
    )
    assert group1[9].queues == {"topic-0": {"broker-0": list(range(4)), "broker-1": list(range(8)),
                                            "broker-2": list(range(7))}}  # fmt: skip
    # Without rate_skew no event carries rates, and the rest hashes as it always has.
    assert not any(e.rates for e in history)
    states = [{k: v for k, v in dataclasses.asdict(e).items() if k != "rates"} for e in history]
    text = json.dumps(states, sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "6ce960ceb32796b75807cf091f22554e337952b3459469d14666c143e88cdafa"
    )
    other = synthetic.Churn(groups=3, events_per_group=30, seed=12)
    assert history != list(synthetic.events(other))


def test_a_group_does_not_depend_on_which_range_generates_it() -> None:
    churn = synthetic.Churn(groups=10, events_per_group=8)
    whole = [e for e in synthetic.events(churn) if e.group in ("group-0000003", "group-0000004")]
    assert list(synthetic.events(churn, first=3, stop=5)) == whole


def test_each_event_applies_the_change_its_reason_names() -> None:
    churn = synthetic.Churn(groups=5, events_per_group=60, zones=3, topics=2, seed=3)
    events = list(synthetic.events(churn))
    assert len(events) == churn.total_events
    seen = set()
    for before, after in itertools.pairwise(events):
        if after.group != before.group:
            assert after.seq == 0
            assert after.reason == "initial"
            continue
        assert after.seq == before.seq + 1
        assert after.time > before.time
        seen.add(after.reason)
        joined = set(after.members) - set(before.members)
        left = set(before.members) - set(after.members)
        rezoned = {
            p for p in set(after.members) & set(before.members) if after.members[p] != before.members[p]
        }
        changed_topics = {t for t in after.queues if after.queues[t] != before.queues[t]}
        expected = {
            "join": (1, 0, 0, 0),
            "leave": (0, 1, 0, 0),
            "zone": (0, 0, 1, 0),
            "queues": (0, 0, 0, 1),
        }[after.reason]
        assert (len(joined), len(left), len(rezoned), len(changed_topics)) == expected
    assert seen == {"join", "leave", "zone", "queues"}


def test_the_mix_limits_the_kinds_of_change() -> None:
    churn = synthetic.Churn(groups=3, events_per_group=20, mix=synthetic.parse_mix("join=1"))
    reasons = {e.reason for e in synthetic.events(churn)}
    assert reasons == {"initial", "join"}


def test_every_group_starts_with_one_broker_per_zone() -> None:
    churn = synthetic.Churn(groups=4, events_per_group=1, zones=4, queues=(2, 6), members=(3, 3))
    for event in synthetic.events(churn):
        assert sorted(event.broker_zones.values()) == ["zone-0", "zone-1", "zone-2", "zone-3"]
        assert len(event.members) == 3
        counts = {len(ids) for ids in event.queues["topic-0"].values()}
        assert len(counts) == 1
        assert 2 <= counts.pop() <= 6


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4", (4, 4)), ("2-8", (2, 8))],
)
def test_ranges(text: str, expected: tuple[int, int]) -> None:
    assert synthetic.parse_range(text, "--queues") == expected


@pytest.mark.parametrize("text", ["0", "8-2", "x", "1-y"])
def test_bad_ranges_name_the_option(text: str) -> None:
    with pytest.raises(ValueError, match="--queues"):
        synthetic.parse_range(text, "--queues")


def test_mix_parsing() -> None:
    assert synthetic.parse_mix("join=2, zone=0.5") == {"join": 2.0, "leave": 0.0, "zone": 0.5, "queues": 0.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("grow=1", "KIND=WEIGHT"),
        ("join", "KIND=WEIGHT"),
        ("join=x", "number"),
        ("join=-1", "negative"),
        ("join=0", "positive"),
    ],
)
def test_bad_mixes_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        synthetic.parse_mix(text)


def test_settings_must_be_positive() -> None:
    with pytest.raises(ValueError, match="groups"):
        synthetic.Churn(groups=0)
