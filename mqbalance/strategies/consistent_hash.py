"""CONSISTENT_HASH (AllocateMessageQueueConsistentHash over RocketMQ's ConsistentHashRouter).

RocketMQ's clients each build the ring and route every queue, keeping their own. Here the
ring is built once per group (and kept for its next topics: a group of 256 members with 1,000
virtual nodes each is a ring of 256,000) and every queue is routed once, with the same answer.
"""

from __future__ import annotations

import functools
import hashlib
from bisect import bisect_left
from collections.abc import Sequence

from mqbalance.model import MessageQueue
from mqbalance.strategies.avg import Shares


def md5_hash(key: str) -> int:
    """ConsistentHashRouter.MD5Hash: the first four digest bytes, big-endian, unsigned.

    Java hashes ``key.getBytes()`` (UTF-8, which replaces an unpaired surrogate with '?').
    """
    return int.from_bytes(hashlib.md5(key.encode("utf-8", "replace")).digest()[:4], "big")


class HashRing:
    """The ring of virtual nodes ``<consumerId>-<i>``, i in ``range(virtual_nodes)``."""

    __slots__ = ("_hashes", "_owners")

    def __init__(self, consumers: Sequence[str], virtual_nodes: int) -> None:
        ring: dict[int, str] = {}
        for consumer in consumers:
            for replica in range(virtual_nodes):
                # TreeMap.put: on a hash collision the node added later wins.
                ring[md5_hash(f"{consumer}-{replica}")] = consumer
        self._hashes = sorted(ring)
        self._owners = [ring[h] for h in self._hashes]

    def route(self, key: str) -> str | None:
        """The owner of the first virtual node at or after the key's hash, wrapping around."""
        if not self._hashes:
            return None
        index = bisect_left(self._hashes, md5_hash(key))
        return self._owners[index if index < len(self._hashes) else 0]


def allocate_consistent_hash(
    queues: Sequence[MessageQueue], consumers: Sequence[str], virtual_nodes: int
) -> Shares:
    shares: Shares = {consumer: [] for consumer in consumers}
    ring = _ring(tuple(consumers), virtual_nodes)
    for mq in queues:
        owner = ring.route(str(mq))
        if owner is not None:
            shares[owner].append(mq)
    return shares


@functools.lru_cache(maxsize=2)
def _ring(consumers: tuple[str, ...], virtual_nodes: int) -> HashRing:
    """The ring of ``consumers``, built once for all the topics of a group (never changed: shared)."""
    return HashRing(consumers, virtual_nodes)
