"""The pure reconcile: observed state in, document + status + journal out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mqbalance.model import MessageQueue
from mqbalance.operator.membership import PodInfo
from mqbalance.operator.reconcile import Observed, Outcome, reconcile
from mqbalance.operator.writes import merge_patch

T0 = 1_800_000_000.0
TOPIC = {"topicName": "T", "brokers": [{"name": "b1", "zone": "z1", "readQueueNums": 4, "writeQueueNums": 4}]}
NODES = {"n1": {"topology.kubernetes.io/zone": "z1"}, "n2": {"topology.kubernetes.io/zone": "z2"}}


def pod(name: str, node: str = "n1", ready: bool = True) -> PodInfo:
    return PodInfo(name, {"app": "a"}, node, True, ready)


def observe(pods: list[PodInfo], strategy: str = "AVG", **kw: Any) -> Observed:
    spec = {"topics": ["t"], "selector": {"matchLabels": {"app": "a"}}, "strategy": {"name": strategy}}
    base = Observed(
        namespace="ns",
        name="g",
        spec=spec,
        topics={"t": TOPIC},
        pods=pods,
        node_labels=NODES,
        previous=None,
        now=T0,
        generation=1,
    )
    return replace(base, **kw)


def cond(out: Outcome, kind: str) -> dict[str, Any]:
    return next(c for c in out.status["conditions"] if c["type"] == kind)


def step(obs: Observed, out: Outcome, **kw: Any) -> Observed:
    """The next observation after ``out`` was written."""
    fields = {"previous": out.document or obs.previous, "status": out.status, **kw}
    return replace(obs, **fields)


def test_first_reconcile_publishes_generation_one() -> None:
    out = reconcile(observe([pod("p1"), pod("p2", "n2")]))
    assert out.document is not None
    assert out.document.generation == 1
    assert out.document.reason == "initial"
    assert out.document.members == {"p1": "z1", "p2": "z2"}
    assert out.document.topics["T"]["p1"] == tuple(MessageQueue("T", "b1", i) for i in (0, 1))
    s = out.status
    assert (s["members"], s["queues"], s["minLoad"], s["maxLoad"]) == (2, 4, 2, 2)
    assert s["crossZoneQueues"] == 2
    assert s["zones"] == {"z1": 1, "z2": 1}
    assert s["lastRebalance"] == {"time": "2027-01-15T08:00:00Z", "reason": "initial", "moved": 0}
    assert [cond(out, k)["status"] for k in ("Ready", "Balanced", "Degraded", "Invalid")] == [
        "True",
        "True",
        "False",
        "False",
    ]
    assert out.journal is not None
    assert out.journal.generation == 1
    assert [n.reason for n in out.notes] == ["Rebalanced"]


def test_unchanged_world_publishes_nothing_and_keeps_transition_times() -> None:
    obs = observe([pod("p1"), pod("p2")])
    first = reconcile(obs)
    again = reconcile(step(obs, first, now=T0 + 60))
    assert again.document is None
    assert again.journal is None
    assert again.notes == ()
    assert again.status == first.status


def test_member_joining_bumps_generation_and_counts_moves() -> None:
    obs = observe([pod("p1"), pod("p2")])
    first = reconcile(obs)
    second = reconcile(step(obs, first, pods=[pod("p1"), pod("p2"), pod("p3")], now=T0 + 5))
    assert second.document is not None
    assert second.document.generation == 2
    assert second.document.reason == "member-joined"
    assert second.status["lastRebalance"]["reason"] == "member-joined"
    assert second.figures is not None
    assert second.status["lastRebalance"]["moved"] == second.figures.moved > 0
    ready = cond(second, "Ready")
    assert ready["lastTransitionTime"] == cond(first, "Ready")["lastTransitionTime"]


def test_unready_pod_leaves_and_zone_change_is_its_own_reason() -> None:
    obs = observe([pod("p1"), pod("p2")])
    first = reconcile(obs)
    left = reconcile(step(obs, first, pods=[pod("p1"), pod("p2", ready=False)]))
    assert left.document is not None
    assert left.document.reason == "member-left"
    moved = reconcile(step(obs, first, pods=[pod("p1", "n2"), pod("p2")]))
    assert moved.document is not None
    assert moved.document.reason == "zone-changed"


def test_missing_topic_is_invalid_and_the_last_good_assignment_stays() -> None:
    obs = observe([pod("p1")])
    first = reconcile(obs)
    gone = reconcile(step(obs, first, topics={}, now=T0 + 10, pods=[pod("p1"), pod("p2")]))
    assert gone.document is None
    assert gone.invalid
    invalid = cond(gone, "Invalid")
    assert invalid["reason"] == "TopicNotFound"
    assert "'t' not found in namespace 'ns'" in invalid["message"]
    assert invalid["lastTransitionTime"] == "2027-01-15T08:00:10Z"
    assert cond(gone, "Ready")["status"] == "False"
    assert gone.status["assignmentGeneration"] == 1
    assert [n.type for n in gone.notes] == ["Warning"]
    # the same problem again posts no second event
    still = reconcile(step(obs, gone, previous=first.document, topics={}, now=T0 + 20))
    assert still.notes == ()
    assert cond(still, "Invalid")["lastTransitionTime"] == invalid["lastTransitionTime"]
    # the topic returns: valid again, a new generation
    back = reconcile(step(obs, still, previous=first.document, pods=[pod("p1"), pod("p2")]))
    assert back.document is not None
    assert back.document.generation == 2
    assert cond(back, "Invalid")["status"] == "False"


def test_invalid_spec_names_the_problem() -> None:
    out = reconcile(observe([pod("p1")], strategy="MACHINE_ROOM"))
    assert out.document is None
    assert cond(out, "Invalid")["reason"] == "InvalidSpec"
    assert "consumerIdcs" in cond(out, "Invalid")["message"]


def test_no_members_publishes_empty_assignment() -> None:
    obs = observe([pod("p1")])
    first = reconcile(obs)
    empty = reconcile(step(obs, first, pods=[]))
    assert empty.document is not None
    assert empty.document.members == {}
    assert cond(empty, "Ready")["reason"] == "NoMembers"
    assert cond(empty, "Degraded")["status"] == "True"
    assert cond(empty, "Balanced")["status"] == "Unknown"
    assert empty.status["unassignedQueues"] == 4


def test_more_members_than_queues_is_degraded() -> None:
    out = reconcile(observe([pod(f"p{i}") for i in range(6)]))
    assert cond(out, "Degraded")["reason"] == "IdleMembers"
    assert "2 members hold none" in cond(out, "Degraded")["message"]


def test_uneven_strategy_is_not_balanced() -> None:
    spec = {
        "topics": ["t"],
        "selector": {"matchLabels": {"app": "a"}},
        "strategy": {"name": "CONFIG", "config": {"p1": [{"broker": "b1", "queueId": i} for i in range(4)]}},
    }
    out = reconcile(observe([pod("p1"), pod("p2")], spec=spec))
    assert cond(out, "Balanced")["status"] == "False"
    assert cond(out, "Degraded")["status"] == "False"


def test_sticky_keeps_the_previous_owners_after_a_restart() -> None:
    obs = observe([pod("p1"), pod("p2"), pod("p3")], strategy="STICKY")
    first = reconcile(obs)
    # A restarted operator has no memory but the ConfigMap's document and the status.
    again = reconcile(step(obs, first, now=T0 + 3600))
    assert again.document is None
    grown = reconcile(step(obs, first, pods=[pod("p1"), pod("p2"), pod("p3"), pod("p4")]))
    assert grown.figures is not None
    assert grown.figures.moved == grown.figures.minimum_moves


def test_generation_never_goes_back_when_the_configmap_vanished() -> None:
    obs = observe([pod("p1")])
    first = reconcile(obs)
    later = reconcile(step(obs, first, pods=[pod("p1"), pod("p2")]))
    assert later.document is not None
    lost = reconcile(replace(obs, previous=None, status=later.status))
    assert lost.document is not None
    assert lost.document.generation == 3


def test_merge_patch_nulls_removed_keys() -> None:
    old = {"zones": {"a": 1, "b": 2}, "members": 3, "conditions": [1]}
    new = {"zones": {"a": 1}, "members": 3, "conditions": [2], "queues": 4}
    assert merge_patch(old, new) == {"zones": {"b": None}, "conditions": [2], "queues": 4}
    assert merge_patch(None, new) == new


def test_spec_valid_is_announced_whenever_invalid_turns_false() -> None:
    # The Topic vanishes, then comes back unchanged: nothing new to publish, but the group
    # recovered and says so (SpecValid), not only when a new generation goes out.
    obs = observe([pod("p1"), pod("p2")])
    first = reconcile(obs)
    gone = step(obs, first, topics={})
    broken = reconcile(gone)
    assert cond(broken, "Invalid")["status"] == "True"
    assert [n.reason for n in broken.notes] == ["TopicNotFound"]
    back = step(gone, broken, topics={"t": TOPIC})
    healed = reconcile(back)
    assert healed.document is None
    assert cond(healed, "Invalid")["status"] == "False"
    assert [n.reason for n in healed.notes] == ["SpecValid"]
    assert reconcile(step(back, healed)).notes == ()


def three_topics(strategy: str) -> Observed:
    topics = {
        name: {"brokers": [{"name": "b1", "zone": "z1", "readQueueNums": 5, "writeQueueNums": 5}]}
        for name in ("t1", "t2", "t3")
    }
    obs = observe([pod("p1"), pod("p2")], strategy, topics=topics)
    return replace(obs, spec={**obs.spec, "topics": ["t1", "t2", "t3"]})


def test_sticky_balances_a_multi_topic_group_in_total() -> None:
    # 3 topics x 5 queues over 2 members: each topic alone gives its extra queue to p1 (9 and 6).
    out = reconcile(three_topics("STICKY"))
    assert out.document is not None
    loads = {m: sum(len(a[m]) for a in out.document.topics.values()) for m in ("p1", "p2")}
    assert sorted(loads.values()) == [7, 8]
    assert all(abs(len(a["p1"]) - len(a["p2"])) == 1 for a in out.document.topics.values())
    assert (out.status["topicSpread"], cond(out, "Balanced")["reason"]) == (1, "EvenLoads")


def test_balanced_says_when_only_the_total_is_uneven() -> None:
    out = reconcile(three_topics("AVG"))  # RocketMQ's tilt: every topic's extra queue to p1
    assert (out.status["minLoad"], out.status["maxLoad"], out.status["topicSpread"]) == (6, 9, 1)
    balanced = cond(out, "Balanced")
    assert (balanced["status"], balanced["reason"]) == ("False", "UnevenLoads")
    assert "from 6 to 9" in balanced["message"]


def test_a_topic_without_readable_queues_keeps_its_last_assignment() -> None:
    # RocketMQ's strategies refuse an empty queue list, so a client keeps the queues it has.
    obs = observe([pod("p1"), pod("p2")])
    first = reconcile(obs)
    assert first.document is not None
    write_only = {"name": "b1", "zone": "z1", "readQueueNums": 4, "writeQueueNums": 4, "perm": 2}
    unreadable = {"t": {**TOPIC, "brokers": [write_only]}}
    out = reconcile(step(obs, first, topics=unreadable, pods=[pod("p1"), pod("p2"), pod("p3")]))
    assert out.document is not None  # p3 joined
    assert out.document.topics["T"] == {**first.document.topics["T"], "p3": ()}
    degraded = cond(out, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NoReadableQueues")
    assert "topic(s) T have no readable queue" in degraded["message"]


def test_the_outcome_says_which_changes_concern_the_group_from_now_on() -> None:
    stranger = PodInfo("x", {"app": "other"}, "n2", True, True)
    spec = {"topics": ["t"], "selector": {"matchLabels": {"app": "a"}}, "debounceSeconds": 5}
    out = reconcile(observe([pod("p1"), pod("p2", "n2", ready=False), stranger], spec=spec))
    interest = out.interest
    assert interest.selector is not None
    assert interest.selector.match_labels == {"app": "a"}
    assert (interest.topics, interest.pods, interest.nodes) == (("t",), ("p1", "p2"), ("n1", "n2"))
    assert (interest.debounce, interest.lapsed, interest.leased) == (5.0, (), False)
    # A Topic missing: invalid, and still routed by its selector (the Topic may come).
    missing = reconcile(observe([pod("p1")], spec={**spec, "topics": ["t", "u"]}))
    assert missing.invalid
    assert (missing.interest.topics, missing.interest.pods) == (("t", "u"), ("p1",))
    # A spec that cannot be read: any change may matter; the Topics it names are still read.
    unread = reconcile(observe([pod("p1")], spec={**spec, "selector": {"matchLabels": "app"}}))
    assert unread.invalid
    assert (unread.interest.selector, unread.interest.topics) == (None, ("t",))


def test_a_handover_asks_for_its_releases_configmap_until_it_exists() -> None:
    spec = {"topics": ["t"], "selector": {"matchLabels": {"app": "a"}}, "strategy": {"name": "STICKY"}}
    release = {**spec, "handover": {"mode": "Release"}}
    assert not reconcile(observe([pod("p1")], spec=spec)).ensure_releases
    assert reconcile(observe([pod("p1")], spec=release)).ensure_releases
    assert not reconcile(observe([pod("p1")], spec=release, releases_configmap=True)).ensure_releases
    # Invalid (a Topic missing) with a handover: created all the same, before anyone acknowledges.
    assert reconcile(observe([pod("p1")], spec={**release, "topics": ["u"]})).ensure_releases
