"""The namespaces a replica watches when the groups are sharded by namespace.

Sharded by group, every replica lists and watches every Pod, Topic, group and ConfigMap, since
the API server cannot send a replica only the objects of its shards; at thousands of groups
that listing and decoding is a replica's largest cost, and sharding does not split it. Sharded
by namespace, a replica runs the informers of a namespace only while it holds the namespace's
shard: they start when the shard is taken (its groups are worked on once all four listings are
whole) and stop when it is given up, and what was kept of the namespace is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from mqbalance.kube import Informer
from mqbalance.operator.world import World

logger = logging.getLogger("mqbalance.operator.scopes")

InformerFactory = Callable[[str], list[Informer[object]]]
"""The informers of one namespace's objects, given its scope (``/namespaces/<ns>``)."""


class NamespaceScopes:
    """The informers of the namespaces this replica holds, started and stopped as that changes."""

    def __init__(self, world: World, informers: InformerFactory, wanted: Callable[[str], bool]) -> None:
        self.world = world
        self._informers = informers
        self._wanted = wanted
        self.known: set[str] = set()
        """The namespaces served (those listed, or every one that exists with --all-namespaces)."""
        self._running: dict[str, list[asyncio.Task[None]]] = {}

    @property
    def watched(self) -> list[str]:
        """The namespaces watched now, whole or still being listed."""
        return sorted(self._running)

    def set_known(self, namespaces: Iterable[str]) -> None:
        self.known = set(namespaces)
        self.update()

    def on_namespace(self, key: tuple[str, str], old: object | None, new: object | None) -> None:
        """A Namespace appeared or went away (the informer of Namespaces, with --all-namespaces)."""
        if new is None:
            self.known.discard(key[1])
        else:
            self.known.add(key[1])
        self.update()

    def update(self) -> None:
        """Watch the known namespaces of the shards held now, and only those."""
        for namespace in sorted(self.known):
            if namespace not in self._running and self._wanted(namespace):
                self._start(namespace)
        for namespace in list(self._running):
            if namespace not in self.known or not self._wanted(namespace):
                self._stop(namespace)

    async def stop_all(self) -> None:
        tasks = [task for tasks in self._running.values() for task in tasks]
        self._running.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, namespace: str) -> None:
        self.world.listing.add(namespace)
        informers = self._informers(f"/namespaces/{namespace}")
        tasks = [asyncio.create_task(i.run(), name=f"informer {i.path}") for i in informers]
        tasks.append(asyncio.create_task(self._listed(namespace, informers), name=f"listing {namespace}"))
        self._running[namespace] = tasks

    def _stop(self, namespace: str) -> None:
        # Cancelled here and now, not by a task that would let an informer deliver one more
        # change before it ends: nothing of the namespace comes back after it is forgotten.
        for task in self._running.pop(namespace):
            task.cancel()
        self.world.forget_namespace(namespace)
        logger.info("namespace %s: no longer watched here", namespace)

    async def _listed(self, namespace: str, informers: list[Informer[object]]) -> None:
        await asyncio.gather(*(i.synced.wait() for i in informers))
        logger.info("namespace %s: listed; its groups are worked on here", namespace)
        self.world.listed(namespace)
