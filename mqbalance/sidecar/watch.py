"""Where assignments and routes come from: API watches, mounted files, or a test.

Each group's ConfigMap is watched alone (``fieldSelector=metadata.name=<name>``), so the
sidecar's Role can grant get/list/watch on that one ``resourceName``. The watches are the
operator's own informers (``mqbalance.kube``): they relist after 410 Gone at once and
reconnect after other failures with backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from mqbalance.contract import (
    CONFIGMAP_KEY,
    MANAGED_BY,
    MEMBER_CLIENTS_ANNOTATION,
    MEMBER_LEASE_LABEL,
    TOPICS,
    AssignmentDocument,
    DocumentError,
    RouteNotRead,
    SpecError,
    configmap_name,
    custom_path,
    member_lease_name,
    read_topic,
)
from mqbalance.kube import ApiError, Informer, Key, KubeClient, LeaseLock
from mqbalance.sidecar.state import SidecarState

log = logging.getLogger(__name__)


class AssignmentSource(Protocol):
    """Feeds a :class:`SidecarState` until cancelled."""

    async def run(self, state: SidecarState) -> None: ...


def apply_text(state: SidecarState, group: str, text: str) -> None:
    """Decode and serve a document; a bad one is logged and the previous one kept."""
    try:
        doc = AssignmentDocument.decode(text)
    except DocumentError as e:
        log.error("group %s: unreadable assignment document (%s); keeping what is served", group, e)
        state.metrics.invalid_documents.labels(group).inc()
        return
    state.publish(group, doc)


class FileSource:
    """A mounted ConfigMap file, read again every ``interval`` seconds.

    The kubelet refreshes mounted ConfigMaps up to a minute late; this is the
    fallback for pods that may not talk to the API server.
    """

    def __init__(self, group: str, path: Path, interval: float = 2.0) -> None:
        self.group = group
        self.path = path
        self.interval = interval

    async def run(self, state: SidecarState) -> None:
        last: str | None = None
        missing_logged = False
        while True:
            try:
                text = self.path.read_text()
            except OSError as e:
                if not missing_logged:
                    log.warning("group %s: cannot read %s (%s); waiting for it", self.group, self.path, e)
                    missing_logged = True
            else:
                missing_logged = False
                if text != last:
                    last = text
                    apply_text(state, self.group, text)
            await asyncio.sleep(self.interval)


def configmap_snapshot(obj: Mapping[str, Any]) -> str | None:
    """What the sidecar keeps of its ConfigMap: the document's text (None without one)."""
    text = (obj.get("data") or {}).get(CONFIGMAP_KEY)
    return text if isinstance(text, str) else None


def topic_snapshot(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The spec, and the route the operator read from a NameServer (for Topics that name one)."""
    return {"spec": obj.get("spec") or {}, "route": (obj.get("status") or {}).get("route")}


class MemberLease:
    """Renews this pod's coordination.k8s.io Lease while a served document carries lease terms.

    Every renewal that succeeds confirms contact with the API server from the moment it was
    *sent* (a slow answer must not stretch the grant past what the operator counts from);
    :class:`~mqbalance.sidecar.state.SidecarState` fences the groups once ``lease.seconds`` pass
    without one. The Lease is owned by the Pod when its uid is known, so it goes with the Pod.

    After a failed renewal (and before the first), contact counts only once the groups'
    ConfigMaps (``groups``) have been read again too: a watch cut with the renewals may not have
    caught up yet, and a pod must not serve again what was taken from it meanwhile.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        pod: str,
        pod_uid: str = "",
        *,
        groups: tuple[str, ...] = (),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube, self._namespace, self.groups = kube, namespace, groups
        self._stale = True
        """No renewal succeeded since the last failure: read the documents again before trusting it."""
        owner = [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid}] if pod_uid else []
        self.lock = LeaseLock(
            kube,
            namespace,
            member_lease_name(pod),
            pod,
            DEFAULT_MEMBER_LEASE,
            monotonic=monotonic,
            labels={MANAGED_BY[0]: MANAGED_BY[1], MEMBER_LEASE_LABEL[0]: MEMBER_LEASE_LABEL[1]},
            owner_references=owner,
        )

    async def run(self, state: SidecarState) -> None:
        state.grant.enabled = True
        state.check_fences()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(state.watch_fences())
            tasks.create_task(self.renew(state))

    async def renew(self, state: SidecarState) -> None:
        while True:
            terms = state.lease_terms()
            if terms is None:  # no document with a lease (yet): nothing to renew
                state.grant.changed.clear()
                await state.grant.changed.wait()
                continue
            await self.renew_once(state, terms.seconds, terms.renew_seconds)
            await asyncio.sleep(terms.renew_seconds)

    async def renew_once(self, state: SidecarState, lease: float, renew: float) -> bool:
        """One renewal (at most ``renew`` seconds long); whether it succeeded."""
        lock = self.lock
        lock.duration = lease
        if state.clients:
            lock.annotations[MEMBER_CLIENTS_ANNOTATION] = json.dumps(list(state.clients))
        before = lock.renewed_at
        try:
            async with asyncio.timeout(max(renew, 1.0)):
                await lock.try_hold()
        except TimeoutError:
            log.warning("member lease %s: renewal timed out after %gs", lock.name, max(renew, 1.0))
        ok = lock.renewed_at is not None and lock.renewed_at != before
        if ok and self._stale:
            ok = await self.resync(state)
        state.metrics.lease_renewals.labels("ok" if ok else "failed").inc()
        self._stale = not ok
        if ok:
            assert lock.renewed_at is not None
            state.confirm_contact(lock.renewed_at)
        return ok

    async def resync(self, state: SidecarState) -> bool:
        """Read each group's ConfigMap now and serve what it holds; whether every read succeeded."""
        for group in self.groups:
            path = f"/api/v1/namespaces/{self._namespace}/configmaps/{configmap_name(group)}"
            try:
                text = configmap_snapshot(await self._kube.get(path))
            except ApiError as e:
                if e.status != 404:
                    log.warning("group %s: cannot read the assignment after a lost renewal: %s", group, e)
                    return False
                state.withdraw(group)
                continue
            if text is not None:
                apply_text(state, group, text)
        return True


DEFAULT_MEMBER_LEASE = 20.0


class KubernetesSource:
    """Watches every group's ConfigMap (unless it has a file) and the namespace's Topics."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        groups: list[str],
        *,
        files: Mapping[str, Path] | None = None,
        watch_topics: bool = True,
        file_interval: float = 2.0,
        member_lease: MemberLease | None = None,
    ) -> None:
        self._kube = kube
        self._member_lease = member_lease
        self._namespace = namespace
        self._groups = groups
        self._files = dict(files or {})
        self._watch_topics = watch_topics
        self._file_interval = file_interval

    async def run(self, state: SidecarState) -> None:
        async with asyncio.TaskGroup() as tasks:
            for group in self._groups:
                if group in self._files:
                    tasks.create_task(FileSource(group, self._files[group], self._file_interval).run(state))
                else:
                    tasks.create_task(self.configmap_informer(state, group).run())
            if self._watch_topics:
                tasks.create_task(self.topic_informer(state).run())
            if self._member_lease is not None:
                tasks.create_task(self._member_lease.run(state))

    def configmap_informer(self, state: SidecarState, group: str) -> Informer[str | None]:
        name = configmap_name(group)

        def changed(key: Key, old: str | None, text: str | None) -> None:
            if key[1] != name:
                return
            if text is not None:
                apply_text(state, group, text)
            elif key in informer.store:  # there, but without a document
                log.error("group %s: ConfigMap has no key %r; keeping what is served", group, CONFIGMAP_KEY)
                state.metrics.invalid_documents.labels(group).inc()
            else:
                log.warning("group %s: ConfigMap %s is gone; serving nothing", group, name)
                state.withdraw(group)

        informer = Informer(
            self._kube,
            f"/api/v1/namespaces/{self._namespace}/configmaps",
            configmap_snapshot,
            changed,
            field_selector=f"metadata.name={name}",
            on_restart=state.metrics.watch_restarts.labels("configmap").inc,
        )
        return informer

    def topic_informer(self, state: SidecarState) -> Informer[Mapping[str, Any]]:
        def changed(key: Key, old: Mapping[str, Any] | None, topic: Mapping[str, Any] | None) -> None:
            if topic is None:
                state.delete_route(key[1])
                return
            try:
                route = read_topic(key[1], topic["spec"], topic["route"])
            except RouteNotRead as e:
                log.info("%s; serving its route once the operator has read it", e)
                state.delete_route(key[1])
                return
            except SpecError as e:
                log.error("%s; not serving its route", e)
                state.delete_route(key[1])
                return
            state.put_route(key[1], route)

        return Informer(
            self._kube,
            custom_path(TOPICS, self._namespace),
            topic_snapshot,
            changed,
            on_restart=state.metrics.watch_restarts.labels("topics").inc,
        )


class FilesSource:
    """Every group from a mounted file; no API server involved."""

    def __init__(self, files: Mapping[str, Path], interval: float = 2.0) -> None:
        self._files = dict(files)
        self._interval = interval

    async def run(self, state: SidecarState) -> None:
        async with asyncio.TaskGroup() as tasks:
            for group, path in self._files.items():
                tasks.create_task(FileSource(group, path, self._interval).run(state))
