"""Helpers and fixtures for the sidecar's unit tests: an app on a controllable clock, documents, routes."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from mqbalance.contract import AssignmentDocument
from mqbalance.model import Broker, MessageModel, MessageQueue, TopicRoute
from mqbalance.producer import Generation, QueueSelector
from mqbalance.sidecar.app import STATE, create_app
from mqbalance.sidecar.config import SidecarConfig
from mqbalance.sidecar.state import SidecarState
from mqbalance.sidecar.watch import AssignmentSource

POD = "orders-7f9c-abcde"
OTHER = "orders-7f9c-fghij"


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def ms(self) -> int:
        """The same time in whole milliseconds: the producer's fault clock."""
        return round(self.now * 1000)


def document(
    generation: int,
    queues: Mapping[str, Mapping[str, list[tuple[str, int]]]] | None = None,
    *,
    computed_at: float = 0.0,
    group: str = "orders-consumer",
    reason: str = "member-joined",
    zones: Mapping[str, str] | None = None,
) -> AssignmentDocument:
    """A document with topic -> member -> [(broker, queueId)]; by default two pods share 'orders'.
    Each member is in its zone of ``zones``, or in zone-a."""
    if queues is None:
        queues = {
            "orders": {
                POD: [("broker-a", 0), ("broker-a", 1)],
                OTHER: [("broker-b", 0), ("broker-b", 1)],
            }
        }
    members = sorted({m for topic in queues.values() for m in topic})
    return AssignmentDocument(
        group=group,
        generation=generation,
        strategy="STICKY",
        message_model=MessageModel.CLUSTERING,
        computed_at=computed_at,
        reason=reason,
        members={m: (zones or {}).get(m, "zone-a") for m in members},
        topics={
            t: {m: tuple(MessageQueue(t, b, q) for b, q in qs) for m, qs in by_member.items()}
            for t, by_member in queues.items()
        },
    )


ROUTE = TopicRoute(
    topic="orders",
    brokers=(
        Broker("broker-a", 4, 4, zone="zone-a"),
        Broker("broker-b", 4, 4, zone="zone-b"),
    ),
)


def make_config(**overrides: object) -> SidecarConfig:
    settings: dict[str, object] = {
        "pod_name": POD,
        "namespace": "shop",
        "groups": ("orders",),
        "zone": "zone-b",
        "max_wait": 5.0,
    }
    settings.update(overrides)
    return SidecarConfig(**settings)  # type: ignore[arg-type]


def make_state(
    config: SidecarConfig, clock: FakeClock, generation: Generation = Generation.V5
) -> SidecarState:
    selector = QueueSelector(
        generation=generation,
        fault_tolerance=config.fault_tolerance,
        clock=clock.ms,
        rng=random.Random(7),
        index_start=0,
    )
    return SidecarState(config.pod_name, config.groups, selector, clock=clock)


Client = TestClient[web.Request, web.Application]
Factory = Callable[..., Awaitable[Client]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_client(aiohttp_client: AiohttpClient, clock: FakeClock) -> Factory:
    """Builds the app with ``create_app`` and returns a test client; state is ``client.app[STATE]``."""

    async def build(
        generation: Generation = Generation.V5, source: AssignmentSource | None = None, **overrides: object
    ) -> Client:
        config = make_config(**overrides)
        app = create_app(config, source=source, state=make_state(config, clock, generation))
        return await aiohttp_client(app)

    return build


def state_of(client: Client) -> SidecarState:
    return client.app[STATE]


class MemorySource:
    """Documents and routes handed over in-process: a source the test drives."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue()

    def publish(self, group: str, doc: AssignmentDocument) -> None:
        self._queue.put_nowait(("publish", group, doc))

    def put_route(self, resource: str, route: TopicRoute) -> None:
        self._queue.put_nowait(("route", resource, route))

    async def run(self, state: SidecarState) -> None:
        while True:
            action, key, value = await self._queue.get()
            if action == "publish":
                state.publish(key, value)
            else:
                state.put_route(key, value)
