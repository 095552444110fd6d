"""The operator's pod index: every pod that can match a selector, by label pair."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.operator.membership import PodIndex, PodInfo
from mqbalance.operator.spec import LabelSelector, Requirement

# -- PodIndex ------------------------------------------------------------------------------------

KEYS = st.sampled_from(["app", "tier", "zone"])
VALUES = st.sampled_from(["a", "b", "c"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=3)
SELECTORS = st.builds(
    LabelSelector,
    st.dictionaries(KEYS, VALUES, max_size=2),
    st.lists(
        st.builds(Requirement, KEYS, st.sampled_from(["In", "NotIn"]), st.frozensets(VALUES, min_size=1)),
        max_size=1,
    ).map(tuple),
)
# (namespace, pod name, labels or None for a deletion)
CHANGES = st.lists(
    st.tuples(
        st.sampled_from(["ns1", "ns2"]), st.sampled_from([f"p{i}" for i in range(6)]), LABELS | st.none()
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(changes=CHANGES, selector=SELECTORS)
def test_candidates_hold_every_matching_pod_of_the_namespace_and_only_its_pods(
    changes: list[tuple[str, str, dict[str, str] | None]], selector: LabelSelector
) -> None:
    index = PodIndex()
    world: dict[tuple[str, str], PodInfo] = {}
    for ns, name, labels in changes:
        if labels is None:
            assert index.remove(ns, name) == world.pop((ns, name), None)
        else:
            info = PodInfo(name, labels)
            assert index.put(ns, info) == world.get((ns, name))
            world[(ns, name)] = info
    assert len(index) == len(world)
    for ns in ("ns1", "ns2"):
        pods = {n: p for (pns, n), p in world.items() if pns == ns}
        candidates = index.candidates(ns, selector)
        names = [p.name for p in candidates]
        assert names == sorted(set(names)), "candidates are unique and sorted by name"
        assert all(pods[p.name] == p for p in candidates), "only this namespace's current pods"
        matching = {n for n, p in pods.items() if selector.matches(p.labels)}
        assert matching <= set(names)
        if not selector.match_labels:
            assert set(names) == set(pods)
        assert index.candidates(ns, None) == [pods[n] for n in sorted(pods)]


def test_candidates_of_a_match_labels_selector_are_the_pods_with_its_rarest_pair() -> None:
    index = PodIndex()
    for i in range(10):
        index.put("ns", PodInfo(f"web-{i}", {"tier": "web", "app": f"a{i % 5}"}))
    index.put("ns", PodInfo("db-0", {"tier": "db", "app": "a1"}))
    selector = LabelSelector({"tier": "web", "app": "a1"})
    assert [p.name for p in index.candidates("ns", selector)] == ["db-0", "web-1", "web-6"]
    # A relabelled pod leaves its old pairs.
    index.put("ns", PodInfo("web-1", {"tier": "web", "app": "a2"}))
    assert [p.name for p in index.candidates("ns", selector)] == ["db-0", "web-6"]
    assert index.candidates("ns", LabelSelector({"app": "nowhere"})) == []
    assert index.candidates("other", selector) == []
