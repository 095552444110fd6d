"""AVG and AVG_BY_CIRCLE (AllocateMessageQueueAveragely, AllocateMessageQueueAveragelyByCircle)."""

from __future__ import annotations

from collections.abc import Sequence

from mqbalance.model import MessageQueue

Shares = dict[str, list[MessageQueue]]
"""Consumer -> its queues; the strategies' internal result (the package turns it into tuples)."""


def allocate_avg(queues: Sequence[MessageQueue], consumers: Sequence[str]) -> Shares:
    """Contiguous blocks in queue order; the first ``len(queues) % len(consumers)`` consumers get one more.

    The Java computes ``averageSize`` and ``startIndex`` per consumer; laid side by side
    those blocks tile the sorted queue list exactly like this.
    """
    if not consumers:
        return {}
    base, extra = divmod(len(queues), len(consumers))
    shares: Shares = {}
    start = 0
    for index, consumer in enumerate(consumers):
        size = base + 1 if index < extra else base
        shares[consumer] = list(queues[start : start + size])
        start += size
    return shares


def allocate_avg_by_circle(queues: Sequence[MessageQueue], consumers: Sequence[str]) -> Shares:
    """Deal the queues like cards: queue ``i`` goes to consumer ``i % len(consumers)``."""
    count = len(consumers)
    return {consumer: list(queues[index::count]) for index, consumer in enumerate(consumers)}
