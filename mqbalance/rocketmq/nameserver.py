"""An asyncio client for a RocketMQ NameServer: topic routes and cluster info.

One connection per request (routes are read every few seconds at most, and a NameServer
closes idle connections anyway). The protocol is :mod:`mqbalance.rocketmq.remoting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Iterable, Mapping

from mqbalance.rocketmq.remoting import (
    FrameError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    decode_payload,
    encode,
    frame_length,
    request,
)
from mqbalance.rocketmq.route import ClusterInfo, TopicRouteData, decode_cluster_info, decode_topic_route

DEFAULT_TIMEOUT = 3.0
"""Seconds for one request: connect, send and answer (the Java client's default is 3 s)."""


class NameServerError(Exception):
    """A NameServer request failed; the message says which server and why."""


class NameServerUnreachable(NameServerError):
    """No NameServer could be reached (every address refused, timed out or broke the protocol)."""


class TopicNotFound(NameServerError):
    """Every NameServer that answered says the topic does not exist (response code 17)."""


class RequestFailed(NameServerError):
    """A NameServer answered with an error code other than TOPIC_NOT_EXIST."""

    def __init__(self, address: str, code: int, remark: str | None) -> None:
        self.address = address
        self.code = code
        self.remark = remark
        super().__init__(f"NameServer {address} answered code {_code_name(code)}: {remark or '(no remark)'}")


def _code_name(code: int) -> str:
    try:
        return f"{code} ({ResponseCode(code).name})"
    except ValueError:
        return str(code)


def parse_addresses(addresses: str | Iterable[str]) -> tuple[str, ...]:
    """``host:port`` addresses from RocketMQ's ``namesrvAddr`` form (``a:9876;b:9876``) or a list."""
    items = addresses.replace(",", ";").split(";") if isinstance(addresses, str) else list(addresses)
    parsed = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"NameServer address {item!r} is not host:port (e.g. 10.0.0.5:9876)")
        parsed.append(item)
    if not parsed:
        raise ValueError("no NameServer address given (expected host:port, several separated by ';')")
    return tuple(parsed)


_opaque = itertools.count(1)


async def invoke(address: str, command: RemotingCommand, timeout: float = DEFAULT_TIMEOUT) -> RemotingCommand:
    """Send one request to ``address`` and return its response.

    Raises OSError (refused, reset), TimeoutError, or FrameError (not a RocketMQ peer).
    """
    host, _, port = address.rpartition(":")
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(encode(command))
            await writer.drain()
            while True:
                length = frame_length(await reader.readexactly(4))
                response = decode_payload(await reader.readexactly(length))
                # A server may push requests of its own on the connection; skip them.
                if response.is_response and response.opaque == command.opaque:
                    return response
        except asyncio.IncompleteReadError as exc:
            raise ConnectionResetError(f"connection closed after {len(exc.partial)} bytes") from None
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class NameServerClient:
    """Routes from one or more NameServers, tried in turn.

    NameServers do not talk to each other: every broker registers with each of them, so any
    one that answers is as good as another. As RocketMQ's clients do (``NettyRemotingClient``
    starts its ``namesrvIndex`` at a random value, keeps the NameServer it chose while it works,
    and takes the next one when it fails), the first request starts at a random address, so
    clients given the same list spread over it; the last one that answered is asked first; one
    that fails passes the request on to the next in the list, and a request no NameServer
    answered leaves the next one starting one address further. ``rng`` picks the start
    (tests pass a seeded ``random.Random``).
    """

    def __init__(
        self,
        addresses: str | Iterable[str],
        timeout: float = DEFAULT_TIMEOUT,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.addresses = parse_addresses(addresses)
        self.timeout = timeout
        self._first = (rng if rng is not None else random).randrange(len(self.addresses))
        """The index of the address asked first."""
        self.answered = ""
        """The NameServer that answered last."""

    async def topic_route(self, topic: str) -> TopicRouteData:
        """The topic's route; TopicNotFound, NameServerUnreachable or RequestFailed otherwise."""
        if not topic:
            raise ValueError("topic name is empty")
        response, address = await self._ask(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, what=f"route of topic {topic!r}"
        )
        try:
            return decode_topic_route(topic, response.body)
        except FrameError as exc:
            raise NameServerError(f"NameServer {address} sent an unreadable route: {exc}") from None

    async def cluster_info(self) -> ClusterInfo:
        response, address = await self._ask(RequestCode.GET_BROKER_CLUSTER_INFO, {}, what="cluster info")
        try:
            return decode_cluster_info(response.body)
        except FrameError as exc:
            raise NameServerError(f"NameServer {address} sent unreadable cluster info: {exc}") from None

    async def _ask(
        self, code: RequestCode, fields: Mapping[str, object], *, what: str
    ) -> tuple[RemotingCommand, str]:
        failures: list[str] = []
        not_found: list[str] = []
        n = len(self.addresses)
        for step in range(n):
            index = (self._first + step) % n
            address = self.addresses[index]
            try:
                response = await invoke(address, request(code, next(_opaque), fields), self.timeout)
            except TimeoutError:
                failures.append(f"{address}: no answer within {self.timeout:g} s")
                continue
            except (OSError, FrameError) as exc:
                failures.append(f"{address}: {type(exc).__name__}: {exc}")
                continue
            if response.code == ResponseCode.SUCCESS:
                self._first = index
                self.answered = address
                return response, address
            if response.code == ResponseCode.TOPIC_NOT_EXIST:
                # A NameServer that restarted knows a topic only once its brokers re-register
                # (every 30 s): ask the others before believing it.
                not_found.append(f"{address}: {response.remark or 'topic not exist'}")
                continue
            if response.code in (ResponseCode.SYSTEM_BUSY, ResponseCode.SYSTEM_ERROR) and step + 1 < n:
                failures.append(f"{address}: code {_code_name(response.code)}: {response.remark}")
                continue
            raise RequestFailed(address, response.code, response.remark)
        # Nobody answered with a route: the next request starts at the next address.
        self._first = (self._first + 1) % n
        if not_found:
            raise TopicNotFound(
                f"{what}: no such topic on any NameServer ({'; '.join(not_found + failures)})"
            )
        raise NameServerUnreachable(f"{what}: no NameServer answered ({'; '.join(failures)})")
