"""Every HTTP listener of the product: a cap on open connections, an idle and a read timeout.

Left to itself, aiohttp accepts every connection it is offered, keeps an idle one for its keep-alive
timeout (an hour; one that never sends a request, for ever before 3.14.5) and reads a request for as
long as the client takes, each unfinished head holding its parser's buffers: 200 connections with
unfinished 250 KB heads took a sidecar from 41 to 137 MiB, past its 128 MiB limit. Each listener here
serves an aiohttp application through :class:`Site`, whose connections obey :class:`Limits`:

- a connection waits at most ``idle_timeout`` between two requests;
- a request's head and body arrive within ``read_timeout`` of its first byte (the first request's,
  of the connection's opening; the TLS handshake likewise), however slowly a client trickles them.
  Handling is not reading: a long-poll holds its request as long as it waits;
- at ``max_connections`` a new connection closes the one that has waited longest without a request
  in progress (idle, or still sending its request): clients that go on sending requests get in, and
  the connections of one that only holds them go first. When every connection is busy with a request
  the new one is closed at once rather than left unaccepted in the backlog, so that its client learns
  it at once instead of waiting for a slot that may not come;
- a request has at most ``max_headers`` header lines (each at most aiohttp's 8190 bytes; aiohttp
  enforces the count from 3.13.4); a body (POST, PUT, PATCH) is read before the handler runs, within
  the application's ``client_max_size``: 413 beyond it, 408 when it does not arrive in time, 400 when
  it cannot be decoded, each a JSON ``{"error": ..., "status": N}``;
- what aiohttp keeps of a request it refused is collected soon after (:class:`_Garbage`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from mqbalance.listener_limits import Limits, add_arguments, limits_from, parse_hosts

__all__ = ["Limits", "Site", "add_arguments", "limits_from", "on_close", "parse_hosts", "runner", "serve"]

log = logging.getLogger("mqbalance.listener")

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
REPORT_INTERVAL = 60.0
"""Seconds between two warnings of a listener at its cap."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol behind a watch on its deadlines."""

    def __init__(self, handler: web.RequestHandler, table: _Table) -> None:
        self.handler = handler
        self.table = table
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.BaseTransport | None = None
        self.admitted = False
        self.busy = False
        """A request is being handled (its head has arrived)."""
        self.reading_since: float | None = None
        """When the request being read began: its first byte, or the connection's opening."""
        self.unconsumed = 0
        """Bytes received since the last request began: one still being read, or one aiohttp refused."""
        self.deadline = 0.0
        """While no request is in progress: when the listener's sweep closes the connection."""
        self.peer_eof = False
        self.watchers: dict[object, Callable[[bool], None]] = {}
        """Called once the connection closes (:func:`on_close`), by key."""

    # -- asyncio.Protocol: to aiohttp, with the deadlines kept on the way --------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if not self.table.admit(self):
            transport.close()
            return
        self.admitted = True
        self.handler.connection_made(transport)
        self._reading(self.loop.time())

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if not self.busy:
            self.unconsumed += len(data)
            if self.reading_since is None:
                self._reading(self.loop.time())
        self.handler.data_received(data)

    def eof_received(self) -> None:
        self.peer_eof = True
        if self.admitted:
            self.handler.eof_received()  # None: the transport closes

    def pause_writing(self) -> None:
        if self.admitted:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.table.forget(self)
        if self.admitted:
            self.handler.connection_lost(exc)
            if self.unconsumed:
                GARBAGE.add(self.unconsumed)
        watchers, self.watchers = self.watchers, {}
        by_peer = self.peer_eof or exc is not None
        for callback in watchers.values():
            try:
                callback(by_peer)
            except Exception:
                log.exception("a connection's close callback failed")

    # -- the request's life, told by the middleware ------------------------------------------

    def request_started(self) -> float:
        """The head has arrived; returns the loop time by which the body must have too."""
        self.busy = True
        self.unconsumed = 0
        self.table.waiting.pop(self, None)
        began = self.reading_since if self.reading_since is not None else self.loop.time()
        self.reading_since = None
        return began + self.table.limits.read_timeout

    def request_done(self) -> None:
        self.busy = False
        if self.handler in self.table.open:
            self.table.waiting[self] = None  # the newest waiter, evicted last
            self.deadline = self.loop.time() + self.table.limits.idle_timeout

    def _reading(self, now: float) -> None:
        self.reading_since = now
        self.table.waiting.setdefault(self, None)
        self.deadline = now + self.table.limits.read_timeout

    def close(self) -> None:
        """Close at once: idle or reading for too long, or making room for a new connection."""
        self.table.forget(self)
        transport = self.transport
        self.handler.force_close()
        if isinstance(transport, asyncio.WriteTransport) and transport.get_write_buffer_size():
            transport.abort()  # a response the client does not read: do not wait for it to drain


class _Garbage:
    """What aiohttp read of a request its parser refused (a malformed head, too many header lines) stays in
    reference cycles (the exception's traceback holds the socket reads, up to 256 KiB each) until a full
    garbage collection, which Python's own schedule runs rarely: 512 such requests took a sidecar from 41
    to over 200 MiB. The bytes a connection received that no request consumed count towards the next full
    collection, run once they reach ``COLLECT_BYTES`` (unless collecting would then take more than a fifth
    of the time: junk must not keep a process with a large heap collecting), else ``COLLECT_DELAY``
    seconds after such a connection closes. Well-behaved clients leave no such bytes and cause none."""

    def __init__(self) -> None:
        self.pending = 0
        self.scheduled = False
        self.last = -1.0
        self.cost = 0.0
        """Seconds the last collection took."""
        self.runs = 0

    def add(self, unconsumed: int) -> None:
        self.pending += unconsumed
        if self.pending >= COLLECT_BYTES and time.monotonic() - self.last >= 4 * self.cost:
            self._collect()
        elif not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_later(COLLECT_DELAY, self._collect)

    def _collect(self) -> None:
        self.pending = 0
        self.scheduled = False
        began = time.monotonic()
        gc.collect()
        self.last = time.monotonic()
        self.cost = self.last - began
        self.runs += 1


COLLECT_BYTES = 8 * 1024 * 1024
COLLECT_DELAY = 0.5
GARBAGE = _Garbage()


class _Table:
    """The open connections of one listener."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: dict[web.RequestHandler, _Connection] = {}
        """By aiohttp's protocol, which each request names."""
        self.waiting: dict[_Connection, None] = {}
        """Connections without a request in progress, the one waiting longest first."""
        self.evicted = 0
        self.refused = 0
        self._reported = -REPORT_INTERVAL

    def admit(self, conn: _Connection) -> bool:
        if len(self.open) >= self.limits.max_connections:
            if self.waiting:
                next(iter(self.waiting)).close()
                self.evicted += 1
                self._report()
            else:
                self.refused += 1
                self._report()
                return False
        self.open[conn.handler] = conn
        return True

    async def sweep(self) -> None:
        """Close the connections past their deadline, for as long as the listener runs: a pass over the
        waiting connections every quarter of the shorter timeout (at most a second), nothing per request."""
        limits = self.limits
        interval = min(1.0, limits.read_timeout / 4, limits.idle_timeout / 4)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for conn in [c for c in self.waiting if c.deadline <= now]:
                log.debug(
                    "closing a connection %s", "idle" if conn.reading_since is None else "still reading"
                )
                conn.close()

    def forget(self, conn: _Connection) -> None:
        if self.open.get(conn.handler) is conn:
            del self.open[conn.handler]
        self.waiting.pop(conn, None)

    def _report(self) -> None:
        now = time.monotonic()
        if now - self._reported < REPORT_INTERVAL:
            return
        self._reported = now
        log.warning(
            "%d connections open, the cap (--max-connections): closed %d waiting the longest for new ones, "
            "refused %d while every connection was busy",
            len(self.open),
            self.evicted,
            self.refused,
        )
        self.evicted = self.refused = 0


TABLE = web.AppKey("listener_connections", _Table)


def json_error(status: int, message: str) -> web.Response:
    """``{"error": ..., "status": N}``, on a connection closed after it (the request was not read)."""
    response = web.json_response({"error": message, "status": status}, status=status)
    response.force_close()
    return response


def on_close(request: web.Request, key: object, callback: Callable[[bool], None]) -> bool:
    """Call ``callback(by_peer)`` once, when the connection ``request`` came on closes: ``by_peer``
    when the client closed it or reset it (its process exited or died: the kernel closes a dead
    process's sockets), not when the listener did (idle, evicted, refused, stopping). One callback
    per ``key`` and connection; False when the connection is already closed (or not this listener's)."""
    conn = request.app[TABLE].open.get(request.protocol) if TABLE in request.app else None
    if conn is None:
        return False
    conn.watchers.setdefault(key, callback)
    return True


def _middleware(table: _Table) -> Middleware:
    @web.middleware
    async def limited(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = table.open.get(request.protocol)
        if conn is None:  # closed meanwhile
            return await handler(request)
        read_by = conn.request_started()
        try:
            if (
                request.method in BODY_METHODS
                and request.body_exists
                and request.match_info.http_exception is None
            ):
                seconds = table.limits.read_timeout
                try:
                    if request.content.is_eof():  # all of it arrived with the head: nothing to wait for
                        await request.read()
                    else:
                        async with asyncio.timeout_at(read_by):
                            await request.read()  # kept: the handler's read() returns it
                except TimeoutError:
                    return json_error(408, f"the request did not arrive within {seconds:g} s")
                except web.HTTPRequestEntityTooLarge as e:
                    return json_error(413, f"the request body is too large: {e.text}")
                except web.RequestPayloadError as e:
                    # Nothing more can be read: aiohttp would try after the answer and log a traceback.
                    request.content.feed_eof()
                    return json_error(400, f"the request body cannot be read: {' '.join(str(e).split())}")
            return await handler(request)
        finally:
            conn.request_done()

    return limited


def runner(app: web.Application, limits: Limits) -> web.AppRunner:
    """An AppRunner for ``app`` under ``limits``; serve it with :class:`Site` once set up."""
    table = _Table(limits)
    app[TABLE] = table
    app.middlewares.insert(0, _middleware(table))  # outermost: it sees every request start and end
    return web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.idle_timeout,
        max_headers=limits.max_headers,
        # After a refused body aiohttp reads and drops the rest for this long, so the client sees the answer
        # rather than a reset, then closes.
        lingering_time=limits.read_timeout,
    )


class Site(web.BaseSite):
    """Listens on ``hosts`` at ``port`` for a :func:`runner`'s application."""

    def __init__(
        self,
        app_runner: web.AppRunner,
        hosts: Sequence[str],
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(app_runner, ssl_context=ssl_context)
        self._app_runner = app_runner
        self._hosts = list(hosts)
        self._port = port
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return ",".join(f"{scheme}://{host}:{self.port}" for host in self._hosts)

    @property
    def port(self) -> int:
        """The port listened on (the one the system chose for port 0)."""
        server = self._server
        if isinstance(server, asyncio.Server) and server.sockets:
            port: int = server.sockets[0].getsockname()[1]
            return port
        return self._port

    @property
    def connections(self) -> int:
        return len(self._app_runner.app[TABLE].open)

    async def start(self) -> None:
        await super().start()
        server = self._app_runner.server
        table = self._app_runner.app[TABLE]
        if server is None:
            raise RuntimeError("call runner.setup() before starting a site")
        loop = asyncio.get_running_loop()
        self._sweeper = loop.create_task(table.sweep(), name=f"listener sweep {self._hosts} {self._port}")
        self._server = await loop.create_server(
            lambda: _Connection(server(), table),
            self._hosts,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            ssl_handshake_timeout=table.limits.read_timeout if self._ssl_context else None,
        )

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        await super().stop()


async def serve(
    app: web.Application,
    hosts: Sequence[str],
    port: int,
    limits: Limits,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> web.AppRunner:
    """Set ``app`` up and listen; the runner's ``cleanup()`` stops it."""
    app_runner = runner(app, limits)
    await app_runner.setup()
    await Site(app_runner, hosts, port, ssl_context=ssl_context).start()
    return app_runner
