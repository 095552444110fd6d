"""Reads consumer groups' offsets from RocketMQ's brokers (asyncio), for the lag figures.

For each subscribed topic the route comes from a NameServer (as every RocketMQ client reads it);
then each broker of the route is asked once per (group, topic) with ``GET_CONSUME_STATS`` (code
208), which returns the max offset and the group's committed offset of every queue of the
topic on that broker: one request per broker and topic, the batch ``mqadmin consumerProgress``
sends too. Requests are paced by a token bucket shared by all groups (``rate`` a second), at
most ``per_broker`` in flight to one broker, each bounded by ``timeout``. A broker that cannot
be reached, does not answer in time or refuses the query is reported with its reason; the
queues of the brokers that answered are kept.

Brokers that check ACL get the request signed as RocketMQ's ``AclClientRPCHook`` signs it, with
the access and secret key of the Secret a Topic names (``spec.nameServer.aclSecretRef``), read
from the API server once a round.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqbalance.lag import GET_CONSUME_STATS, ConsumeStatsError, QueueOffsets, decode_consume_stats
from mqbalance.model import MessageQueue
from mqbalance.rocketmq.nameserver import (
    DEFAULT_TIMEOUT,
    NameServerClient,
    NameServerError,
    NameServerUnreachable,
    TopicNotFound,
    invoke,
    parse_addresses,
)
from mqbalance.rocketmq.remoting import Credentials, FrameError, ResponseCode, request, sign
from mqbalance.rocketmq.route import MASTER_ID, TopicRouteData

DEFAULT_RATE = 50.0
"""Broker requests a second at most, over every group (bursts of DEFAULT_BURST)."""
DEFAULT_BURST = 20
DEFAULT_PER_BROKER = 4
"""Requests in flight to one broker at most."""

_opaque = itertools.count(1)

SecretGetter = Callable[[str, str], Awaitable[Mapping[str, Any]]]
"""Reads Secret (namespace, name) from the API server: the object as JSON."""


def secret_credentials(secret: Mapping[str, Any]) -> Credentials:
    """The ``accessKey`` and ``secretKey`` of a Secret; ValueError naming what is missing."""
    data = secret.get("data")
    data = data if isinstance(data, Mapping) else {}
    keys: dict[str, str] = {}
    for key in ("accessKey", "secretKey"):
        value = data.get(key)
        try:
            keys[key] = base64.b64decode(value, validate=True).decode() if isinstance(value, str) else ""
        except (binascii.Error, UnicodeDecodeError):
            keys[key] = ""
        if not keys[key]:
            raise ValueError(f"has no key {key!r} (base64 of a UTF-8 string)")
    return Credentials(keys["accessKey"], keys["secretKey"])


@dataclass(frozen=True)
class BrokerFailure:
    """One broker (or the route to it) that gave no offsets."""

    reason: str
    """BrokerUnreachable, QueryRefused, NoRoute, NoNameServer or NoCredentials."""
    broker: str
    """The broker name ("" when the route itself could not be read)."""
    topic: str
    message: str


@dataclass(frozen=True)
class GroupOffsets:
    """One reading of a group's offsets over its topics."""

    offsets: Mapping[MessageQueue, QueueOffsets]
    failures: tuple[BrokerFailure, ...] = ()
    requests: int = 0


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; ``take`` waits for one."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be above 0 and burst at least 1")
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self.rate)


@dataclass
class OffsetReader:
    """Offsets of groups from the brokers their topics' routes name."""

    default_name_server: str | None = None
    """NameServers for topics whose Topic names none (the operator's --name-server)."""
    timeout: float = DEFAULT_TIMEOUT
    rate: float = DEFAULT_RATE
    per_broker: int = DEFAULT_PER_BROKER
    secrets: SecretGetter | None = None
    """Reads the Secrets named by ``aclSecretRef``; None: Topics that name one are not read."""
    _bucket: TokenBucket | None = None
    _credentials: dict[tuple[str, str], asyncio.Task[Credentials | str]] = field(default_factory=dict)
    """This round's Secret reads: credentials, or why there are none."""
    _clients: dict[tuple[str, ...], NameServerClient] = field(default_factory=dict)
    _brokers: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    _routes: dict[tuple[str, tuple[str, ...]], asyncio.Task[TopicRouteData | BrokerFailure]] = field(
        default_factory=dict
    )
    """This round's route reads, one per topic and NameServer list however many groups read it."""
    _down: dict[str, str] = field(default_factory=dict)
    """Broker addresses that failed to answer this round -> why: not asked again until the next."""

    def begin_round(self) -> None:
        """A new round over the groups: routes are read again, brokers that failed are asked again."""
        self._routes.clear()
        self._down.clear()
        self._credentials.clear()  # a rotated key is used from the next round on

    async def credentials(self, namespace: str, secret: str, topic: str) -> Credentials | BrokerFailure:
        """The credentials in Secret ``secret`` of ``namespace``, read once a round."""
        key = (namespace, secret)
        task = self._credentials.get(key)
        if task is None:
            task = self._credentials[key] = asyncio.ensure_future(self._read_credentials(namespace, secret))
        got = await asyncio.shield(task)
        if isinstance(got, Credentials):
            return got
        return BrokerFailure("NoCredentials", "", topic, f"topic {topic}: Secret {namespace}/{secret} {got}")

    async def _read_credentials(self, namespace: str, secret: str) -> Credentials | str:
        if self.secrets is None:
            return "cannot be read: the operator reads no Secrets"
        try:
            return secret_credentials(await self.secrets(namespace, secret))
        except ValueError as e:
            return str(e)
        except Exception as e:  # whatever the API server said (not found, forbidden): reported, not raised
            return f"cannot be read: {e}"

    def bucket(self) -> TokenBucket:
        if self._bucket is None:
            self._bucket = TokenBucket(self.rate, max(1, min(DEFAULT_BURST, int(self.rate) or 1)))
        return self._bucket

    async def route(self, topic: str, addresses: Sequence[str] = ()) -> TopicRouteData | BrokerFailure:
        """The topic's route from its NameServers (or the default ones), read once a round."""
        key = (topic, tuple(addresses))
        task = self._routes.get(key)
        if task is None:
            task = self._routes[key] = asyncio.ensure_future(self._read_route(topic, addresses))
        return await asyncio.shield(task)

    async def _read_route(self, topic: str, addresses: Sequence[str]) -> TopicRouteData | BrokerFailure:
        try:
            wanted = parse_addresses(list(addresses)) if addresses else None
        except ValueError as e:
            return BrokerFailure("NoRoute", "", topic, f"topic {topic}: {e}")
        if wanted is None:
            if not self.default_name_server:
                return BrokerFailure(
                    "NoNameServer",
                    "",
                    topic,
                    f"topic {topic}: no NameServer to read its route from (the Topic names none and the "
                    "operator runs without --name-server)",
                )
            wanted = parse_addresses(self.default_name_server)
        client = self._clients.get(wanted)
        if client is None:
            client = self._clients[wanted] = NameServerClient(wanted, self.timeout)
        try:
            return await client.topic_route(topic)
        except (NameServerUnreachable, TopicNotFound, NameServerError) as e:
            return BrokerFailure("NoRoute", "", topic, str(e))

    async def consume_stats(
        self, broker: str, address: str, group: str, topic: str, credentials: Credentials | None = None
    ) -> dict[MessageQueue, QueueOffsets] | BrokerFailure:
        """One GET_CONSUME_STATS to one broker: the group's offsets of the topic's queues there
        (signed with ``credentials`` when given)."""
        semaphore = self._brokers.setdefault(address, asyncio.Semaphore(self.per_broker))
        async with semaphore:
            if address in self._down:  # failed already this round: no one waits for its timeout again
                return BrokerFailure("BrokerUnreachable", broker, topic, self._down[address])
            await self.bucket().take()
            command = request(GET_CONSUME_STATS, next(_opaque), {"consumerGroup": group, "topic": topic})
            if credentials is not None:
                command = sign(command, credentials)
            try:
                response = await invoke(address, command, self.timeout)
            except TimeoutError:
                message = f"broker {broker} ({address}): no answer within {self.timeout:g} s"
                self._down[address] = message
                return BrokerFailure("BrokerUnreachable", broker, topic, message)
            except (OSError, FrameError) as e:
                message = f"broker {broker} ({address}): {type(e).__name__}: {e}"
                self._down[address] = message
                return BrokerFailure("BrokerUnreachable", broker, topic, message)
        if response.code != ResponseCode.SUCCESS:
            return BrokerFailure(
                "QueryRefused",
                broker,
                topic,
                f"broker {broker} ({address}) refused GET_CONSUME_STATS of group {group}, topic {topic}: "
                f"code {response.code}: {response.remark or '(no remark)'}",
            )
        try:
            stats = decode_consume_stats(response.body)
        except ConsumeStatsError as e:
            return BrokerFailure("QueryRefused", broker, topic, f"broker {broker} ({address}): {e}")
        # Only this topic's queues on this broker (a broker answers for the topic asked).
        return {q: o for q, o in stats.offsets.items() if q.topic == topic and q.broker_name == broker}

    async def read_group(
        self,
        group: str,
        topics: Iterable[tuple[str, Sequence[str]]],
        credentials: Mapping[str, Credentials | BrokerFailure] | None = None,
    ) -> GroupOffsets:
        """Offsets of ``group`` over ``topics`` (RocketMQ topic, its NameServer addresses or none);
        the requests for a topic in ``credentials`` are signed (or, a failure there, not sent)."""
        failures: list[BrokerFailure] = []
        calls = []
        for topic, addresses in topics:
            signer = (credentials or {}).get(topic)
            if isinstance(signer, BrokerFailure):
                failures.append(signer)
                continue
            route = await self.route(topic, addresses)
            if isinstance(route, BrokerFailure):
                failures.append(route)
                continue
            for data in route.queue_datas:
                broker = route.broker(data.broker_name)
                address = broker_address(broker.addresses) if broker is not None else None
                if address is None:
                    failures.append(
                        BrokerFailure(
                            "BrokerUnreachable",
                            data.broker_name,
                            topic,
                            f"broker {data.broker_name}: the route names no address for it",
                        )
                    )
                    continue
                calls.append(self.consume_stats(data.broker_name, address, group, topic, signer))
        offsets: dict[MessageQueue, QueueOffsets] = {}
        for result in await asyncio.gather(*calls):
            if isinstance(result, BrokerFailure):
                failures.append(result)
            else:
                offsets.update(result)
        return GroupOffsets(offsets, tuple(failures), len(calls))


def broker_address(addresses: Mapping[int, str]) -> str | None:
    """The master's address, else the slave of the lowest id (as the admin tool's selectBrokerAddr)."""
    if MASTER_ID in addresses:
        return addresses[MASTER_ID]
    return addresses[min(addresses)] if addresses else None
