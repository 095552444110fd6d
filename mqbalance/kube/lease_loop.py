"""Lease renewals on an event loop of their own, in a thread of their own, with a client of their own.

A holder renews its Leases every third of their duration and must count one as lost after two
thirds. Renewed on the event loop that also reconciles, that deadline depends on the work: with
thousands of groups due, or under a tight CPU limit, a renewal waits behind every ready
reconcile callback and behind the client's request slots, the Lease lapses, the replica refuses
work, and the refused work comes back at once and delays the next renewal too (a livelock,
docs/benchmarks.md). client-go runs leader election in a goroutine of its own for the same
reason. Here the renewals compete for the interpreter lock only, which a busy thread hands over
every few milliseconds (``sys.getswitchinterval()``), and for nothing else.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from mqbalance.kube.client import KubeClient

T = TypeVar("T")


class LeaseLoop:
    """An event loop in a daemon thread and a :class:`KubeClient` that lives on it.

    Coroutines given to :meth:`run` run there; whatever they share with the calling loop must be
    safe to read from another thread (single attribute reads and writes are).
    """

    def __init__(self, name: str = "leases") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.client: KubeClient | None = None

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    async def start(self, kubeconfig: str | Path | None, *, requests: int = 8) -> KubeClient:
        """Start the thread and connect its client (the kubeconfig's or the pod's credentials)."""
        self._thread.start()
        self.client = await self.run(KubeClient.connect(kubeconfig, requests=requests))
        return self.client

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this loop and wait for it; cancelling the wait cancels it there."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    async def stop(self) -> None:
        """Cancel what still runs there, close the client, and end the thread."""
        if not self._thread.is_alive():
            self._loop.close()
            return
        await self.run(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join)

    async def _close(self) -> None:
        """On this loop: every other task cancelled and finished before the client they use closes."""
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.client is not None:
            await self.client.close()
            self.client = None
