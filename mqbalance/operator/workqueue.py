"""A keyed work queue, as controller-runtime's: every key is processed by one worker at a time,
a key added while queued is queued once, and a key added while processed runs again after.
Keys of a lower ``priority`` go first (the operator publishes groups before it writes Topic
status, which nothing waits for).

Delayed adds (debounce windows, retries) keep the earliest time asked for, so a burst of
changes inside a window becomes one reconcile at its end. A key whose processing failed goes
back with :meth:`WorkQueue.add_rate_limited`, after a backoff that doubles with each failure in
a row until :meth:`WorkQueue.forget_failures` (controller-runtime's AddRateLimited and Forget).
Time comes from an injected :class:`Timer`, so tests drive it by hand.

The queue also says whether its keys move (:meth:`WorkQueue.stalled_for`): the liveness probe
fails when keys wait and none has been taken or finished for too long.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)

BASE_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0


class Timer(Protocol):
    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle | None: ...


class LoopTimer:
    """The event loop's own clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_at(when, callback)


class WorkQueue(Generic[K]):
    def __init__(self, timer: Timer | None = None, priority: Callable[[K], int] = lambda key: 0) -> None:
        self.timer: Timer = timer or LoopTimer()
        self._priority = priority
        self._queues: dict[int, deque[K]] = {}
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._delayed: dict[K, tuple[float, asyncio.TimerHandle | None]] = {}
        self._getters: deque[asyncio.Future[K]] = deque()
        self._failures: dict[K, int] = {}
        self._moved_at: float | None = None
        """When a key was last taken or finished, or queued while none waited."""

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def waiting(self) -> int:
        """How many keys wait for a later time (debounce windows, retries, polls)."""
        return len(self._delayed)

    @property
    def busy(self) -> int:
        """How many keys are being processed now."""
        return len(self._active)

    def stalled_for(self) -> float:
        """Seconds keys have waited with no key taken or finished meanwhile; 0 while none waits."""
        if not len(self) or self._moved_at is None:
            return 0.0
        return self.timer.now() - self._moved_at

    def active(self) -> frozenset[K]:
        """The keys being processed now."""
        return frozenset(self._active)

    def add(self, key: K) -> None:
        """Process ``key`` as soon as a worker is free (and after its current run, if any)."""
        pending = self._delayed.pop(key, None)
        if pending is not None and pending[1] is not None:
            pending[1].cancel()
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            while self._getters:  # a worker is waiting: hand the key over
                getter = self._getters.popleft()
                if not getter.done():
                    self._active.add(key)
                    getter.set_result(key)
                    self._moved_at = self.timer.now()
                    return
            if not len(self):  # the first to wait: a stall counts from here
                self._moved_at = self.timer.now()
            self._queued.add(key)
            level = self._priority(key)
            queue = self._queues.get(level)
            if queue is None:
                queue = self._queues[level] = deque()
                self._queues = dict(sorted(self._queues.items()))
            queue.append(key)

    def add_after(self, key: K, delay: float) -> None:
        """Process ``key`` after ``delay`` seconds, or earlier if it is already due earlier."""
        if delay <= 0:
            self.add(key)
            return
        if key in self._queued:
            return
        when = self.timer.now() + delay
        pending = self._delayed.get(key)
        if pending is not None and pending[0] <= when:
            return
        if pending is not None and pending[1] is not None:
            pending[1].cancel()
        self._delayed[key] = (when, self.timer.call_at(when, lambda: self._due(key, when)))

    def due_at(self, key: K) -> float | None:
        """When a delayed ``key`` will be queued, if it is waiting."""
        pending = self._delayed.get(key)
        return pending[0] if pending is not None else None

    def add_rate_limited(self, key: K) -> float:
        """Process ``key`` again after its backoff (1 s, doubling with each failure in a row, at
        most 60 s); returns that delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(BASE_BACKOFF_SECONDS * 2.0 ** (failures - 1), MAX_BACKOFF_SECONDS)
        self.add_after(key, delay)
        return delay

    def forget_failures(self, key: K) -> None:
        """``key`` was processed: its next failure backs off from the start again."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """Failures of ``key`` in a row."""
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """Drop a delayed or queued ``key`` and its failures (its object is gone)."""
        self._failures.pop(key, None)
        pending = self._delayed.pop(key, None)
        if pending is not None and pending[1] is not None:
            pending[1].cancel()
        if key in self._queued:
            self._queued.discard(key)
            self._queues[self._priority(key)].remove(key)
        self._again.discard(key)

    async def get(self) -> K:
        """The next key; the caller must call :meth:`done` with it when finished."""
        for queue in self._queues.values():
            if queue:
                key = queue.popleft()
                self._queued.discard(key)
                self._active.add(key)
                self._moved_at = self.timer.now()
                return key
        getter: asyncio.Future[K] = asyncio.get_running_loop().create_future()
        self._getters.append(getter)
        try:
            return await getter
        except asyncio.CancelledError:
            if getter.done() and not getter.cancelled():  # handed a key, then cancelled: give it back
                key = getter.result()
                self._active.discard(key)
                self.add(key)
            raise

    def done(self, key: K) -> None:
        self._active.discard(key)
        self._moved_at = self.timer.now()
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    def _due(self, key: K, when: float) -> None:
        pending = self._delayed.get(key)
        if pending is not None and pending[0] == when:
            del self._delayed[key]
            self.add(key)
