"""The iteration order of the ``ConcurrentHashMap<String, FaultItem>(16)`` behind RocketMQ's fault table.

RocketMQ 4.9.4+ ranks fault items with a stable sort of the map's values as the map
iterates them (``LatencyFaultToleranceImpl.pickOneAtLeast``), so items that compare
equal keep that order, and which broker a send falls back to depends on it. This
module follows the map's table, bin by bin, through the operations RocketMQ performs
on it (``putIfAbsent`` of a new broker, ``remove``), as ``java.util.concurrent`` of
JDK 8 to 25 does them single-threaded:

- a key's bin is ``spread(String.hashCode) & (n - 1)``, ``spread(h) = (h ^ h >>> 16) & 0x7fffffff``;
- ``new ConcurrentHashMap(16)`` sizes the table to 32 bins, allocated on the first put
  (JDK 8: ``tableSizeFor(16 + 8 + 1)``; JDK 11+: ``tableSizeFor((long) (1 + 16 / 0.75f))``,
  both 32), and resizes to twice the bins when the count reaches 3/4 of the bins;
- a new key goes to the tail of its bin's list; a resize splits each list into the
  low and high bins keeping the longest tail run (``lastRun``) in order and putting
  the nodes before it, reversed, in front of it;
- a list that already holds 8 keys when one more arrives makes a table of fewer than
  64 bins grow (``treeifyBin`` -> ``tryPresize(n << 1)``, which doubles it until its
  threshold reaches ``tableSizeFor(3n + 1)``: 32 bins become 256), or else turns into
  a red-black tree bin, whose iteration order is its linked order with every later
  key put first;
- iteration walks bins 0..n-1, each bin in its linked order.

Not emulated: after a removal from a tree bin Java turns the bin back into a list
or keeps the tree depending on the tree's shape (``TreeBin.removeTreeNode``'s "too
small" test); here it becomes a list when a removal leaves it 6 keys or fewer. That only changes
where later keys of that bin go (tail or head). A tree bin needs 9 broker names in one
bin of a table of 64 or more bins, and RocketMQ removes a fault item only when its
broker leaves the route, so a producer's fault table never gets there in practice.
Concurrency (helping a resize, counter cells) does not exist here: one thread owns it.
"""

from __future__ import annotations

from collections.abc import Iterator

from mqbalance.producer.selectors import java_string_hash

MAXIMUM_CAPACITY = 1 << 30
TREEIFY_THRESHOLD = 8
UNTREEIFY_THRESHOLD = 6
MIN_TREEIFY_CAPACITY = 64
HASH_BITS = 0x7FFFFFFF
FAULT_TABLE_BINS = 32
"""The table size ``new ConcurrentHashMap<>(16)`` allocates on its first put (JDK 8 and 11+)."""


def spread(h: int) -> int:
    """``ConcurrentHashMap.spread``: the high 16 bits folded into the low ones, sign bit cleared."""
    h &= 0xFFFFFFFF
    return (h ^ (h >> 16)) & HASH_BITS


def table_size_for(c: int) -> int:
    """``ConcurrentHashMap.tableSizeFor``: the smallest power of two >= ``c`` (1 for ``c <= 1``)."""
    if c <= 1:
        return 1
    return min(1 << (c - 1).bit_length(), MAXIMUM_CAPACITY)


class ConcurrentMapOrder:
    """The keys of a ``ConcurrentHashMap<String, V>(16)`` in the order it iterates them.

    Holds only the keys' places; the values live wherever the caller keeps them.
    """

    __slots__ = ("_bins", "_count", "_hashes", "_size_ctl", "_trees")

    def __init__(self) -> None:
        self._bins: list[list[str]] = []  # empty until the first put (lazy initTable)
        self._trees: set[int] = set()  # indexes of tree bins
        self._size_ctl = FAULT_TABLE_BINS  # before init: the size to allocate; after: the resize threshold
        self._count = 0
        self._hashes: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        return key in self._hashes

    def __iter__(self) -> Iterator[str]:
        for keys in self._bins:
            yield from keys

    @property
    def table_size(self) -> int:
        """Bins in the table (0 before the first put)."""
        return len(self._bins)

    def add(self, key: str) -> None:
        """``putIfAbsent`` of a key; a key already present keeps its place (Java returns the old value)."""
        if key in self._hashes:
            return
        h = spread(java_string_hash(key))
        if not self._bins:
            n = self._size_ctl
            self._bins = [[] for _ in range(n)]
            self._size_ctl = n - (n >> 2)
        self._hashes[key] = h
        n = len(self._bins)
        i = h & (n - 1)
        keys = self._bins[i]
        if i in self._trees:
            keys.insert(0, key)  # TreeBin.putTreeVal makes the new node `first`
        else:
            bin_count = len(keys)
            keys.append(key)
            if bin_count >= TREEIFY_THRESHOLD:
                self._treeify_bin(i)
        self._count += 1
        # addCount: grow while the count has reached the threshold.
        while self._count >= self._size_ctl and len(self._bins) < MAXIMUM_CAPACITY:
            self._transfer()

    def discard(self, key: str) -> None:
        """``remove`` of a key; absent keys are ignored. The table never shrinks."""
        h = self._hashes.pop(key, None)
        if h is None:
            return
        i = h & (len(self._bins) - 1)
        keys = self._bins[i]
        keys.remove(key)
        if i in self._trees and len(keys) <= UNTREEIFY_THRESHOLD:
            self._trees.discard(i)  # the one approximation: see the module's docstring
        self._count -= 1

    def clear(self) -> None:
        """``clear``: every bin emptied, the table and its threshold kept."""
        for keys in self._bins:
            keys.clear()
        self._trees.clear()
        self._hashes.clear()
        self._count = 0

    def _treeify_bin(self, i: int) -> None:
        n = len(self._bins)
        if n < MIN_TREEIFY_CAPACITY:
            self._try_presize(n << 1)
        else:
            self._trees.add(i)

    def _try_presize(self, size: int) -> None:
        c = MAXIMUM_CAPACITY if size >= (MAXIMUM_CAPACITY >> 1) else table_size_for(size + (size >> 1) + 1)
        while not (c <= self._size_ctl or len(self._bins) >= MAXIMUM_CAPACITY):
            self._transfer()

    def _transfer(self) -> None:
        n = len(self._bins)
        new_bins: list[list[str]] = [[] for _ in range(2 * n)]
        new_trees: set[int] = set()
        hashes = self._hashes
        for i, keys in enumerate(self._bins):
            if not keys:
                continue
            if i in self._trees:
                # TreeBin split: both halves keep the linked order; small halves become lists.
                low = [k for k in keys if not hashes[k] & n]
                high = [k for k in keys if hashes[k] & n]
                if len(low) > UNTREEIFY_THRESHOLD:
                    new_trees.add(i)
                if len(high) > UNTREEIFY_THRESHOLD:
                    new_trees.add(i + n)
            else:
                # The longest tail whose nodes all go the same way moves as it is; the nodes
                # before it are copied to the front of their half, one by one, so reversed.
                run_bit = hashes[keys[0]] & n
                last_run = 0
                for j in range(1, len(keys)):
                    bit = hashes[keys[j]] & n
                    if bit != run_bit:
                        run_bit, last_run = bit, j
                head = keys[:last_run]
                low = [k for k in reversed(head) if not hashes[k] & n]
                high = [k for k in reversed(head) if hashes[k] & n]
                (high if run_bit else low).extend(keys[last_run:])
            new_bins[i] = low
            new_bins[i + n] = high
        self._bins = new_bins
        self._trees = new_trees
        self._size_ctl = (n << 1) - (n >> 1)
