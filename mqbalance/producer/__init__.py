"""The producer side: which queue a send goes to, and which brokers to avoid.

Pure logic (no I/O, no threads): the clock and the random generator are injected,
so the sidecar can host one ``QueueSelector`` per process and tests can drive time.
"""

from mqbalance.producer.faults import (
    FAULT_TABLES,
    LATENCY_4X,
    LATENCY_5X,
    Clock,
    FaultItem,
    FaultTable,
    LatencyFaultTolerance,
    fault_table,
    java_latency,
    monotonic_ms,
    wall_ms,
)
from mqbalance.producer.index import MovingIndex, java_abs, to_int32
from mqbalance.producer.java_map import ConcurrentMapOrder
from mqbalance.producer.selection import Generation, NoWritableQueueError, QueueSelector, writable_queues
from mqbalance.producer.selectors import (
    KeySelector,
    broker_zone,
    hash_index,
    java_string_hash,
    select_by_hash,
    select_by_random,
    zone_queues,
)

__all__ = [
    "FAULT_TABLES",
    "LATENCY_4X",
    "LATENCY_5X",
    "Clock",
    "ConcurrentMapOrder",
    "FaultItem",
    "FaultTable",
    "Generation",
    "KeySelector",
    "LatencyFaultTolerance",
    "MovingIndex",
    "NoWritableQueueError",
    "QueueSelector",
    "broker_zone",
    "fault_table",
    "hash_index",
    "java_abs",
    "java_latency",
    "java_string_hash",
    "monotonic_ms",
    "select_by_hash",
    "select_by_random",
    "to_int32",
    "wall_ms",
    "writable_queues",
    "zone_queues",
]
