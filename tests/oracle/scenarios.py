"""Which scenarios run against which RocketMQ version, and in which mqbalance mode they must agree."""

from __future__ import annotations

import random
from dataclasses import dataclass

from mqbalance.producer import LATENCY_4X, LATENCY_5X, Generation
from tests.oracle.script import fault_scenario, hash_scenario, map_scenario, pick_scenario

SEED = 20_150_15
COUNTS = {"map": 150, "hash": 10, "pick4": 200, "fault4": 300, "fault5": 300, "fault5_reachable": 150}

# kind -> the versions whose classes must answer exactly as the model does.
EXACT = {
    "map": ("4.9.8",),  # the JDK's ConcurrentHashMap: one JVM is enough
    "hash": ("4.9.4", "4.9.8", "5.0.0", "5.1.4", "5.2.0", "5.5.0"),
    "pick4": ("4.9.4", "4.9.8", "5.0.0"),  # LatencyFaultToleranceImpl with the 4.x table
    "fault4": ("4.9.8",),
    "fault5": ("5.2.0", "5.5.0"),
    "fault5_reachable": ("5.1.4",),  # every broker reported reachable: 5.1.4 agrees with 5.2+
}
GENERATION = {"pick4": Generation.V4, "fault4": Generation.V4}

# Where versions differ from the modes, as docs/producer.md says: a script, and what each
# version's classes answer (the model's answer is the one of the version the mode follows).
NOTHING_AVAILABLE = [
    "FAULT",
    "ROUTE T a:2:6 b:2:6",
    "INDEX 0",
    "WORST 0",
    "CLOCK 1000",
    "UPDATE a 5 1 1",
    "UPDATE b 5 1 1",
    "SELECT -",
    "QUEUES",
    "END",
]
READ_ONLY_PICKED = [
    "FAULT",
    "ROUTE T a:2:6 r:2:4",
    "INDEX 0",
    "WORST 0",
    "CLOCK 1000",
    "UPDATE a 5 1 1",
    "UPDATE r 1 1 1",
    "SELECT -",
    "END",
]
UNREACHABLE_AFTER_ITS_WINDOW = [
    "FAULT",
    "ROUTE T a:1:6 b:1:6",
    "INDEX 0",
    "CLOCK 0",
    "UPDATE a 5 1 0",
    "CLOCK 10000",
    "AVAIL a",
    "SELECT -",
    "SELECT -",
    "END",
]
POLYGENELUBRICANTS = "polygenelubricants".encode("utf-16-be").hex()  # String.hashCode: Integer.MIN_VALUE
MIN_VALUE_HASH = [f"HASH 3 {POLYGENELUBRICANTS}", f"HASH 4 {POLYGENELUBRICANTS}", "END"]
DOCUMENTED: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    # 4.7.1 and earlier: Math.abs before %, so MIN_VALUE indexes -2 of 3 queues; 4.8.0+: |MIN % n|.
    "min_hash": (
        MIN_VALUE_HASH,
        {"4.7.1": ["ERR IndexOutOfBoundsException", "0"], "4.9.8": ["2", "0"], "5.5.0": ["2", "0"]},
    ),
    # 4.9.7 and earlier, 5.0.0-5.1.3: the fallback queue is an element of the route's list, rewritten.
    "in_place": (
        NOTHING_AVAILABLE,
        {
            "4.9.4": ["a:1", "a:0,a:1,a:1,b:1"],
            "5.0.0": ["a:1", "a:0,a:1,a:1,b:1"],
            "4.9.8": ["a:1", "a:0,a:1,b:0,b:1"],
        },
    ),
    # Before 4.9.8 pickOneAtLeast's broker is used whatever its permission.
    "read_only": (READ_ONLY_PICKED, {"4.9.4": ["r:1"], "5.0.0": ["r:1"], "4.9.8": ["a:0"]}),
    # 5.1.4 only: an unreachable broker stays unavailable after its window.
    "unreachable": (
        UNREACHABLE_AFTER_ITS_WINDOW,
        {"5.1.4": ["false", "b:0", "b:0"], "5.2.0": ["true", "b:0", "a:0"], "5.5.0": ["true", "b:0", "a:0"]},
    ),
}
DOCUMENTED_MODE = {
    "min_hash": Generation.V5,
    "in_place": Generation.V4,
    "read_only": Generation.V4,
    "unreachable": Generation.V5,
}
MODE_FOLLOWS = {"min_hash": "5.5.0", "in_place": "4.9.8", "read_only": "4.9.8", "unreachable": "5.2.0"}


@dataclass(frozen=True)
class Scenarios:
    scripts: dict[str, list[list[str]]]

    def for_version(self, version: str) -> dict[str, list[list[str]]]:
        kinds = {kind: self.scripts[kind] for kind, where in EXACT.items() if version in where}
        for kind, (script, answers) in DOCUMENTED.items():
            if version in answers:
                kinds[kind] = [script]
        return kinds


def all_scenarios(seed: int = SEED) -> Scenarios:
    rng = random.Random(seed)
    makers = {
        "map": lambda: map_scenario(rng),
        "hash": lambda: hash_scenario(rng),
        "pick4": lambda: pick_scenario(rng),
        "fault4": lambda: fault_scenario(rng, LATENCY_4X, Generation.V4),
        "fault5": lambda: fault_scenario(rng, LATENCY_5X, Generation.V5),
        "fault5_reachable": lambda: fault_scenario(rng, LATENCY_5X, Generation.V5, unreachable=0.0),
    }
    return Scenarios({kind: [make() for _ in range(COUNTS[kind])] for kind, make in makers.items()})


def generation_of(kind: str) -> Generation:
    return GENERATION.get(kind, Generation.V5)
