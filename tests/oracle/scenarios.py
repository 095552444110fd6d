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


@dataclass(frozen=True)
class Scenarios:
    scripts: dict[str, list[list[str]]]

    def for_version(self, version: str) -> dict[str, list[list[str]]]:
        return {kind: self.scripts[kind] for kind, where in EXACT.items() if version in where}


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
