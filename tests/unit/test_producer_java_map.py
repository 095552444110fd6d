"""The fault table's iteration order: Java's ConcurrentHashMap<String, ?>(16), emulated.

The orders below are what java.util.concurrent.ConcurrentHashMap printed (JDK 17) for the same
puts; tests/oracle compares thousands of random put/remove sequences against the JDK itself.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbalance.producer import LATENCY_4X, ConcurrentMapOrder, LatencyFaultTolerance, java_string_hash
from mqbalance.producer.java_map import spread, table_size_for

# Java's order of "broker-0" .. "broker-23", put in that order (the 24th put doubles the table).
BROKERS_0_TO_23 = [
    f"broker-{i}"
    for i in (2, 3, 0, 1, 22, 23, 20, 21, 13, 14, 11, 8, 12, 9, 6, 10, 7, 4, 5, 19, 17, 18, 15, 16)
]


def filled(keys: list[str]) -> ConcurrentMapOrder:
    order = ConcurrentMapOrder()
    for key in keys:
        order.add(key)
    return order


def test_a_new_map_of_16_allocates_32_bins_on_the_first_put() -> None:
    order = ConcurrentMapOrder()
    assert order.table_size == 0
    order.add("broker-a")
    assert order.table_size == 32


def test_order_is_bin_by_bin_with_equal_hashes_in_put_order() -> None:
    # "Aa" and "BB" share a String.hashCode and so a bin; the broker names fall in later bins.
    assert java_string_hash("Aa") == java_string_hash("BB")
    assert list(filled(["broker-a", "broker-b", "broker-c", "Aa", "BB"])) == [
        "Aa",
        "BB",
        "broker-b",
        "broker-c",
        "broker-a",
    ]
    assert list(filled(["BB", "Aa"])) == ["BB", "Aa"]


def test_the_24th_key_doubles_the_table_and_reorders_as_java_does() -> None:
    order = filled([f"broker-{i}" for i in range(23)])
    assert order.table_size == 32
    order.add("broker-23")  # count reaches 3/4 of 32
    assert order.table_size == 64
    assert list(order) == BROKERS_0_TO_23
    order.add("broker-24")
    assert list(order) == [*BROKERS_0_TO_23[:4], "broker-24", *BROKERS_0_TO_23[4:]]


def test_removal_keeps_the_others_in_place() -> None:
    order = filled([f"broker-{i}" for i in range(24)])
    order.discard("broker-13")
    order.discard("never-there")
    assert list(order) == [k for k in BROKERS_0_TO_23 if k != "broker-13"]
    assert len(order) == 23
    assert "broker-13" not in order
    order.clear()
    assert list(order) == []
    assert order.table_size == 64  # clear keeps the table, as Java's


def test_a_ninth_key_in_one_bin_grows_a_small_table_to_256() -> None:
    # Nine names with one hash: treeifyBin on 32 bins calls tryPresize(64), which doubles
    # until the threshold reaches tableSizeFor(97) = 128.
    names = [
        p + q + r + s for p in ("Aa", "BB") for q in ("Aa", "BB") for r in ("Aa", "BB") for s in ("Aa", "BB")
    ]
    order = filled(names[:9])
    assert order.table_size == 256
    assert list(order) == names[:9]


@pytest.mark.parametrize(
    ("c", "size"), [(0, 1), (1, 1), (2, 2), (22, 32), (25, 32), (32, 32), (33, 64), (97, 128)]
)
def test_table_size_for(c: int, size: int) -> None:
    assert table_size_for(c) == size


@settings(max_examples=200)
@given(st.integers(-(2**31), 2**31 - 1))
def test_spread_folds_the_high_half_and_clears_the_sign(h: int) -> None:
    u = h & 0xFFFFFFFF
    assert spread(h) == (u ^ (u >> 16)) & 0x7FFFFFFF


def test_pick_one_at_least_breaks_ties_in_the_fault_tables_order() -> None:
    # Three brokers fail in the same millisecond: equal latency and window, nothing available.
    # Java's stable sort keeps the map's order (broker-b, broker-c, broker-a) and, with one item
    # in the better half, always answers its first: broker-b (not broker-a by name).
    faults = LatencyFaultTolerance(LATENCY_4X, clock=lambda: 5_000, worst_index_start=0)
    for name in ("broker-a", "broker-b", "broker-c"):
        faults.update(name, 12, failed=True)
    assert faults.java_order() == ["broker-b", "broker-c", "broker-a"]
    assert [faults.pick_one_at_least() for _ in range(3)] == ["broker-b"] * 3


def test_fractional_latencies_tie_as_java_longs() -> None:
    # 600.2 and 600.9 ms are both 600 to Java: a tie, decided by the map's order.
    faults = LatencyFaultTolerance(LATENCY_4X, clock=lambda: 0, worst_index_start=0)
    for name, latency in (
        ("broker-a", 600.9),
        ("broker-b", 600.2),
        ("broker-c", 20_000),
        ("broker-d", 20_000),
    ):
        faults.update(name, latency)
    assert faults.item("broker-a").current_latency_ms == 600  # type: ignore[union-attr]
    # Ranked: broker-b, broker-a (600 ms, same window, in map order), then the 20 s ones; half = 2.
    assert faults.java_order() == ["broker-d", "broker-b", "broker-c", "broker-a"]
    assert [faults.pick_one_at_least() for _ in range(4)] == ["broker-a", "broker-b", "broker-a", "broker-b"]
