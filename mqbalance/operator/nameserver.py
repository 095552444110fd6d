"""Topic routes for the operator, read from RocketMQ's NameServers (``mqbalance.rocketmq``) and
turned into what the Topic status reconciler acts on (:class:`~mqbalance.operator.topics.RouteRead`).
"""

from __future__ import annotations

from collections.abc import Iterable

from mqbalance.contract.bounds import OverBound, check_route
from mqbalance.operator.topics import RouteRead
from mqbalance.rocketmq.nameserver import (
    DEFAULT_TIMEOUT,
    NameServerClient,
    NameServerError,
    NameServerUnreachable,
    TopicNotFound,
    parse_addresses,
)


class RouteReader:
    """Reads Topic routes for the operator: one client per NameServer list (so each remembers
    which server answered), the operator's own NameServers for Topics that name none."""

    def __init__(self, default: str | Iterable[str] | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.default = parse_addresses(default) if default else ()
        self.timeout = timeout
        self._clients: dict[tuple[str, ...], NameServerClient] = {}

    async def read(self, topic: str, addresses: Iterable[str] = ()) -> RouteRead:
        """The route of RocketMQ topic ``topic``; never raises for what a NameServer does."""
        try:
            wanted = parse_addresses(list(addresses)) if addresses else self.default
        except ValueError as e:
            return RouteRead(None, reason="InvalidSpec", message=f"spec.nameServer.addresses: {e}")
        if not wanted:
            return RouteRead(
                None,
                reason="NoNameServer",
                message="spec.nameServer.addresses is empty and the operator runs without --name-server; "
                "give one of them",
            )
        client = self._clients.get(wanted)
        if client is None:
            client = self._clients[wanted] = NameServerClient(wanted, self.timeout)
        try:
            route = await client.topic_route(topic)
        except NameServerUnreachable as e:
            return RouteRead(None, reason="NameServerUnreachable", message=str(e))
        except TopicNotFound as e:
            return RouteRead(None, reason="TopicNotFound", message=str(e))
        except NameServerError as e:
            return RouteRead(None, reason="RequestFailed", message=str(e))
        brokers = route.to_topic_route().brokers
        try:
            # Counted from the queue numbers: no queue is built for a route over a bound.
            check_route(f"NameServer {client.answered}: topic {topic!r}", brokers)
        except OverBound as e:
            return RouteRead(None, reason=e.reason, message=str(e))
        return RouteRead(brokers, address=client.answered)
