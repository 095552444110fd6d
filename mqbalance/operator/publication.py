"""What the operator published of one ConsumerGroup, and its own writes told apart from others'.

A group's :class:`Publication` owns everything written for the group: its assignment ConfigMap as
last read or written (each write names the resourceVersion it read: a conflict means someone else
wrote it), the write under way and the versions the watch brought meanwhile, the conflicts in a
row, whether its releases ConfigMap was made, and its status as last written. It takes the watch's
events of those objects (``seen``, ``status_seen``), so that our own write coming back is not taken
for a change, and makes the writes (``publish``, ``ensure_releases``, ``write_status``) through the
one :class:`~mqbalance.operator.writes.Writer`. The group reconciler (group_reconciler.py) decides
what to write; the world (world.py) keeps one publication with each group and hands it the events.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mqbalance.contract import CONSUMER_GROUPS, AssignmentDocument
from mqbalance.operator.conditions import condition_status
from mqbalance.operator.writes import Published, Writer, merge_patch, published_from

Cached = Callable[[], Mapping[str, Any] | None]
"""The watch cache's copy of an object as it is now (read after a write, which it may have brought back)."""


@dataclass(slots=True, eq=False)
class Publication:
    """What was written for one group, and whether what the watch brings is our own write."""

    configmap: Published | None = None
    """The assignment ConfigMap as last read or written; None: read it again before the next write."""
    reread: bool = False
    """Read the ConfigMap from the API server, not the watch cache (which may lag behind a
    conflicting write)."""
    writing: list[str | None] | None = None
    """While the ConfigMap is being written: the versions the watch brought meanwhile (None: deleted)."""
    conflicts: int = 0
    """Conflicting ConfigMap writes in a row."""
    problem: str | None = None
    """Why the ConfigMap as last read could not be read (reported once per problem)."""
    releases_made: bool = False
    """The releases ConfigMap was created (or found): not asked for again while the watch catches up."""
    status: Mapping[str, Any] | None = None
    """The group's status as last written (before the first write: as first seen)."""

    # -- the watch ---------------------------------------------------------------------------------

    def seen(self, configmap: Mapping[str, Any] | None) -> bool:
        """The assignment ConfigMap changed or went away (None); whether the group must be reconciled
        for it: not when it is our own write coming back."""
        version = ((configmap or {}).get("metadata") or {}).get("resourceVersion")
        if self.writing is not None:
            # Most likely our write's own echo, ahead of its answer: judged once it is answered.
            self.writing.append(version)
            return False
        if self.configmap is not None and version == self.configmap.resource_version:
            self.configmap.share(configmap)  # our own write come back: keep one copy
            return False
        self.configmap = None
        return True

    def status_seen(self, status: Mapping[str, Any] | None) -> None:
        """The group's status as the watch brings it: our own patch come back is kept as one copy,
        the cache's."""
        if self.status is not None and status == self.status:
            self.status = status

    @property
    def invalid(self) -> bool:
        """The status as written says the spec cannot be honoured."""
        return condition_status(self.status or {}, "Invalid") == "True"

    # -- reads -------------------------------------------------------------------------------------

    async def read(
        self, writer: Writer, namespace: str, name: str, cached: Mapping[str, Any] | None
    ) -> tuple[AssignmentDocument | None, str | None]:
        """The document published now (None: there is none, or it cannot be read), and why it cannot
        be read when that is news. Read from the watch cache's ``cached`` unless a conflict asked for
        the API server."""
        problem = None
        if self.configmap is None:
            if self.reread:
                self.configmap = await writer.read_published(namespace, name)
                self.reread = False
            else:
                self.configmap = published_from(cached)
            new = self.configmap.problem
            problem = new if new != self.problem else None
            self.problem = new
        document = self.configmap.document
        self.configmap.decoded = None  # between reconciles only its text is kept
        return document, problem

    # -- writes ------------------------------------------------------------------------------------

    async def publish(
        self, writer: Writer, owner: Mapping[str, Any], document: AssignmentDocument, cached: Cached
    ) -> bool:
        """Write ``document`` over the ConfigMap as last read (:class:`~mqbalance.kube.Conflict` if it
        changed since); whether someone changed or deleted it right after our write (then it is read
        again and the group reconciled again)."""
        assert self.configmap is not None, "read before publishing"
        self.writing = []
        try:
            self.configmap = await writer.publish(owner, document, self.configmap)
        finally:
            seen, self.writing = self.writing, None
        if all(version == self.configmap.resource_version for version in seen):
            self.configmap.share(cached())  # back already?
            return False
        self.configmap = None
        return True

    def conflicted(self) -> int:
        """A write met someone else's: read the ConfigMap from the API server before the next one.
        The conflicts in a row, this one included."""
        self.configmap = None
        self.reread = True
        self.conflicts += 1
        return self.conflicts

    def reconciled(self) -> None:
        """A reconcile went through: conflicts count from none again."""
        self.conflicts = 0

    async def ensure_releases(self, writer: Writer, owner: Mapping[str, Any]) -> None:
        """Create the group's releases ConfigMap (there already is no error)."""
        await writer.ensure_releases(owner)
        self.releases_made = True

    async def write_status(
        self, writer: Writer, namespace: str, name: str, status: Mapping[str, Any], cached: Cached
    ) -> None:
        """Patch the group's status to ``status`` when it differs from what was written."""
        if status == self.status:
            return
        await writer.patch_status(namespace, CONSUMER_GROUPS, name, merge_patch(self.status, status))
        # The watch may have brought the patched status back already: keep that copy then.
        current = cached()
        self.status = current if current == status else status
