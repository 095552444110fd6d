"""The listeners' limits over real sockets on 127.0.0.1: the connection cap, the read and idle timeouts, the
body checks, over plain TCP and TLS (mqbalance/listener.py)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from harness.polling import scaled
from mqbalance import listener
from mqbalance.injector import certs
from mqbalance.listener import Limits, Site, add_arguments, limits_from, parse_hosts, runner

GET_OK = b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n"
LARGE = 8 * 1024 * 1024
"""A response too large for the socket buffers: a client that does not read it leaves it unsent."""

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Server:
    """An application behind a :class:`Site`: ``/ok``, ``/wait`` (until ``release``), ``/sleep`` (for
    ``seconds``), ``/large`` and ``POST /echo`` (the body's length)."""

    def __init__(self, site: Site, release: asyncio.Event) -> None:
        self.site = site
        self.release = release
        self.waiting = 0

    @property
    def port(self) -> int:
        return self.site.port

    async def connect(self) -> Streams:
        return await asyncio.open_connection("127.0.0.1", self.port)


Start = Callable[..., Awaitable[Server]]


def create_app(release: asyncio.Event, server: list[Server]) -> web.Application:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def wait(_: web.Request) -> web.Response:
        server[0].waiting += 1
        await release.wait()
        return web.Response(text="released")

    async def sleep(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query["seconds"]))
        return web.Response(text="slept")

    async def large(_: web.Request) -> web.Response:
        return web.Response(body=b"x" * LARGE)

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"length": len(await request.read())})

    app = web.Application(client_max_size=1024)
    app.add_routes(
        [
            web.get("/ok", ok),
            web.get("/wait", wait),
            web.get("/sleep", sleep),
            web.get("/large", large),
            web.post("/echo", echo),
        ]
    )
    return app


@pytest_asyncio.fixture
async def start() -> AsyncIterator[Start]:
    runners: list[web.AppRunner] = []
    releases: list[asyncio.Event] = []

    async def build(limits: Limits, ssl_context: ssl.SSLContext | None = None) -> Server:
        release = asyncio.Event()
        holder: list[Server] = []
        app_runner = runner(create_app(release, holder), limits)
        await app_runner.setup()
        runners.append(app_runner)
        releases.append(release)
        site = Site(app_runner, ["127.0.0.1"], 0, ssl_context=ssl_context)
        await site.start()
        holder.append(Server(site, release))
        return holder[0]

    yield build
    for release in releases:
        release.set()
    for app_runner in runners:
        await app_runner.cleanup()


async def response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next response's status and body (0, b"" when the server closed instead)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), scaled(10))
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), scaled(10))
    return int(lines[0].split()[1]), body


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (read to EOF; a reset counts)."""
    try:
        while await asyncio.wait_for(reader.read(65536), scaled(10)):
            pass
    except ConnectionResetError:
        pass
    return True


async def until(condition: Callable[[], bool], what: str, seconds: float = 10) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + scaled(seconds)
    while not condition():
        assert loop.time() < give_up, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# -- the connection cap ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_at_the_cap_a_new_connection_closes_the_one_idle_longest(start: Start) -> None:
    server = await start(Limits(max_connections=8))
    conns = [await server.connect() for _ in range(20)]
    for reader, _ in conns[:12]:  # the twelve oldest made room for the eight newest
        assert await closed(reader)
    assert server.site.connections == 8
    for reader, writer in conns[12:]:
        writer.write(GET_OK)
        assert await response(reader) == (200, b"ok")
    for _, writer in conns:
        writer.close()


@pytest.mark.asyncio
async def test_a_client_that_goes_on_sending_requests_outlasts_connections_held_idle(start: Start) -> None:
    server = await start(Limits(max_connections=4))
    reader, writer = await server.connect()
    held: list[Streams] = []
    for _ in range(3):
        writer.write(GET_OK)
        assert await response(reader) == (200, b"ok")  # its connection is now the newest waiter
        newer = [await server.connect() for _ in range(3)]
        for r, _ in held:  # the previous round's, which waited longer: closed for the newer ones
            assert await closed(r)
        held = newer
        await until(lambda: server.site.connections == 4, "the busy client and three held connections")
    writer.write(GET_OK)
    assert await response(reader) == (200, b"ok")


@pytest.mark.asyncio
async def test_when_every_connection_is_busy_a_new_one_is_closed_at_once(start: Start) -> None:
    server = await start(Limits(max_connections=2))
    busy = [await server.connect() for _ in range(2)]
    for _, writer in busy:
        writer.write(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
    await until(lambda: server.waiting == 2, "two requests in progress")
    reader, _ = await server.connect()
    assert await closed(reader)
    server.release.set()
    for reader, _ in busy:
        assert await response(reader) == (200, b"released")


# -- read and idle timeouts --------------------------------------------------------------


@pytest.mark.parametrize("sent", [b"", b"GET /ok HTTP/1.1\r\nHost: t\r\n"], ids=["nothing", "half-a-head"])
@pytest.mark.asyncio
async def test_a_request_not_sent_within_the_read_timeout_is_cut_off(start: Start, sent: bytes) -> None:
    # Header lines enough that only the read timeout stops the trickle.
    server = await start(Limits(read_timeout=0.5, idle_timeout=60, max_headers=1000))
    loop = asyncio.get_running_loop()
    began = loop.time()
    reader, writer = await server.connect()
    writer.write(sent)

    async def trickle() -> None:  # a slowloris: one header line every 0.1 s, for ever
        while True:
            await asyncio.sleep(0.1)
            writer.write(b"X-Slow: 1\r\n")

    trickling = asyncio.create_task(trickle()) if sent else None
    assert await closed(reader)
    elapsed = loop.time() - began
    if trickling:
        trickling.cancel()
    assert 0.5 <= elapsed < 0.5 + scaled(3), elapsed
    assert server.site.connections == 0


@pytest.mark.asyncio
async def test_handling_is_not_reading_a_long_request_is_answered(start: Start) -> None:
    server = await start(Limits(read_timeout=0.2, idle_timeout=0.2))
    reader, writer = await server.connect()
    writer.write(b"GET /sleep?seconds=1 HTTP/1.1\r\nHost: t\r\n\r\n")  # a long-poll of 5 read timeouts
    assert await response(reader) == (200, b"slept")


@pytest.mark.asyncio
async def test_an_idle_connection_serves_requests_until_the_idle_timeout(start: Start) -> None:
    server = await start(Limits(read_timeout=10, idle_timeout=0.5))
    loop = asyncio.get_running_loop()
    reader, writer = await server.connect()
    for _ in range(3):  # kept alive between requests
        writer.write(GET_OK)
        assert await response(reader) == (200, b"ok")
    answered = loop.time()
    assert await closed(reader)
    elapsed = loop.time() - answered
    assert 0.5 - 0.05 <= elapsed < 0.5 + scaled(3), elapsed


@pytest.mark.asyncio
async def test_a_client_that_does_not_read_its_answer_is_cut_off_at_the_idle_timeout(start: Start) -> None:
    server = await start(Limits(read_timeout=10, idle_timeout=0.5))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(b"GET /large HTTP/1.1\r\nHost: t\r\n\r\n")
    await until(lambda: server.site.connections == 1, "the connection")
    await until(lambda: server.site.connections == 0, "the unread answer to be dropped")
    sock.close()


# -- bodies --------------------------------------------------------------------------------


async def error_of(reader: asyncio.StreamReader) -> tuple[int, str]:
    status, body = await response(reader)
    answer = json.loads(body)
    assert answer["status"] == status
    return status, str(answer["error"])


@pytest.mark.asyncio
async def test_a_body_not_sent_within_the_read_timeout_is_408(start: Start) -> None:
    server = await start(Limits(read_timeout=0.5))
    loop = asyncio.get_running_loop()
    began = loop.time()
    reader, writer = await server.connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
    status, message = await error_of(reader)
    assert (status, "0.5 s" in message) == (408, True)
    assert loop.time() - began >= 0.5
    assert await closed(reader)  # after lingering for the rest of the body at most one more read timeout
    assert loop.time() - began < 1 + scaled(3)


@pytest.mark.parametrize(
    ("body", "headers", "status", "complaint"),
    [
        (b"x" * 2000, b"", 413, "too large"),
        (b"\x1f\x8b garbage", b"Content-Encoding: gzip\r\n", 400, "cannot be read"),
    ],
    ids=["too-large", "broken-gzip"],
)
@pytest.mark.asyncio
async def test_a_body_is_read_before_the_handler_and_refused_as_json(
    start: Start, body: bytes, headers: bytes, status: int, complaint: str
) -> None:
    server = await start(Limits())
    reader, writer = await server.connect()
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n" % len(body) + headers + b"\r\n"
    writer.write(head + body)
    got, message = await error_of(reader)
    assert got == status
    assert complaint in message
    assert await closed(reader)  # what is left of the body is not read
    reader, writer = await server.connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nok")
    status, answer = await response(reader)
    assert (status, json.loads(answer)) == (200, {"length": 2})


@pytest.mark.asyncio
async def test_too_many_header_lines_are_refused(start: Start) -> None:
    server = await start(Limits(max_headers=8))
    reader, writer = await server.connect()
    lines = b"".join(b"X-%d: 1\r\n" % i for i in range(10))
    writer.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n" + lines + b"\r\n")
    status, _ = await response(reader)
    assert status == 400
    assert await closed(reader)


@pytest.mark.asyncio
async def test_a_refused_head_asks_for_a_garbage_collection_and_a_served_request_does_not(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    garbage = listener._Garbage()
    monkeypatch.setattr(listener, "GARBAGE", garbage)
    monkeypatch.setattr(listener, "COLLECT_DELAY", 0.05)
    server = await start(Limits(max_headers=8))
    reader, writer = await server.connect()
    writer.write(GET_OK)
    assert await response(reader) == (200, b"ok")
    writer.close()
    lines = b"".join(b"X-%d: 1\r\n" % i for i in range(10))
    reader, writer = await server.connect()
    writer.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n" + lines + b"\r\n")
    assert (await response(reader))[0] == 400
    assert await closed(reader)
    await until(lambda: garbage.runs == 1, "a collection after the refused head")
    assert garbage.pending == 0


# -- TLS ---------------------------------------------------------------------------------------


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for 127.0.0.1."""
    now = dt.datetime.now(dt.UTC)
    ca_cert, ca_key = certs.new_ca(now, dt.timedelta(days=1))
    cert, key = certs.new_serving_cert(ca_cert, ca_key, ["127.0.0.1"], now, dt.timedelta(days=1))
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client = ssl.create_default_context(cadata=ca_cert.decode())
    return server, client


@pytest.mark.asyncio
async def test_over_tls_a_silent_handshake_an_idle_connection_and_the_cap(
    start: Start, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    server_context, client_context = tls
    server = await start(Limits(max_connections=2, read_timeout=0.5, idle_timeout=1.5), server_context)
    loop = asyncio.get_running_loop()
    began = loop.time()
    silent, _ = await server.connect()  # TCP only: no ClientHello
    assert await closed(silent)
    assert 0.5 <= loop.time() - began < 1.5
    conns = [await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context) for _ in range(3)]
    opened = loop.time()
    assert await closed(conns[0][0])  # the cap of 2 holds over TLS, well before the idle timeout
    assert loop.time() - opened < 1.5
    reader, writer = conns[2]
    writer.write(GET_OK)
    assert await response(reader) == (200, b"ok")
    answered = loop.time()
    assert await closed(reader)
    assert loop.time() - answered >= 1.5 - 0.05


# -- options -------------------------------------------------------------------------------


def test_options_and_their_environment() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, {"MQBALANCE_MAX_CONNECTIONS": "16", "MQBALANCE_READ_TIMEOUT": "2.5"})
    assert limits_from(parser.parse_args([])) == Limits(16, 75.0, 2.5)
    argv = ["--idle-timeout", "30", "--max-connections", "8"]
    assert limits_from(parser.parse_args(argv)) == Limits(8, 30, 2.5)
    bare = argparse.ArgumentParser()
    add_arguments(bare)
    assert limits_from(bare.parse_args([])) == Limits()
    assert "MQBALANCE_" not in bare.format_help()
    for argv, complaint in (
        (["--max-connections", "0"], "--max-connections"),
        (["--max-connections", "many"], "--max-connections"),
        (["--read-timeout", "0"], "--read-timeout"),
        (["--idle-timeout", "-1"], "--idle-timeout"),
    ):
        with pytest.raises(ValueError, match=complaint):
            limits_from(bare.parse_args(argv))


def test_hosts_are_a_comma_separated_list() -> None:
    assert parse_hosts("10.1.2.3,127.0.0.1") == ("10.1.2.3", "127.0.0.1")
    assert parse_hosts(" 0.0.0.0 ") == ("0.0.0.0",)
    for bad in ("", "10.1.2.3,", " , "):
        with pytest.raises(ValueError, match="--metrics-host"):
            parse_hosts(bad, "--metrics-host")
