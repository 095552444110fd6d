"""Whether this pod's application is still there: its connections to the sidecar, by client id.

A RocketMQ broker notices a consumer that crashed the moment its channel closes, and rebalances
its queues at once. The sidecar can notice the same: an application that named its RocketMQ client
(``?client=``, as the Java helper does on every request) holds a connection open to the sidecar
almost always (its long-poll). When the last connection of every client that named itself was
closed *by the client's side* (the process exited or was killed: the kernel closes a dead process's
sockets), the pod is *absent*. A connection the sidecar closed (idle, evicted) says nothing of the
client: a frozen process (SIGSTOP, a long GC) closes nothing, and stays present.

Pure bookkeeping: the listener reports connections opening and closing, the state acts on the
transitions (``state.py``).
"""

from __future__ import annotations


class Presence:
    """The named clients of one pod and their open connections."""

    def __init__(self) -> None:
        self._open: dict[str, set[object]] = {}
        """Client id -> the connections that carried a request naming it and are still open."""
        self.absent = False
        """Some client named itself, none has a connection open, and the last one closed was closed
        by the client's side."""

    def connected(self, client: str, connection: object) -> bool:
        """A request naming ``client`` came on ``connection``; whether the pod is absent (then
        :meth:`confirm`, a moment later, says whether it is back)."""
        self._open.setdefault(client, set()).add(connection)
        return self.absent

    def confirm(self) -> bool:
        """A moment after a request while absent: whether the pod is back, a connection that named a
        client still open. A request is no return by itself: one a process sent just before it was
        killed can be read after its other connections' closes, and its own close follows."""
        if self.absent and self._open:
            self.absent = False
            return True
        return False

    def closed(self, client: str, connection: object, by_peer: bool) -> bool:
        """``connection`` (which carried ``client``'s requests) closed; whether the pod is absent
        from now on (it was not before)."""
        connections = self._open.get(client)
        if connections is None or connection not in connections:
            return False
        connections.discard(connection)
        if not connections:
            del self._open[client]  # bounded by the open connections, however many ids clients send
        if self._open or not by_peer or self.absent:
            return False
        self.absent = True
        return True

    def clients(self) -> int:
        """Clients with a connection open."""
        return len(self._open)
