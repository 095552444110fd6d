"""Which NameServer the operator's client asks: a random start, the one that answered, the next on failure.

``invoke`` is replaced by a fake that answers with frames captured from a real 5.3.3 NameServer
(tests/fixtures/rocketmq); the integration tests in tests/integration/rocketmq/ ask real ones.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from mqbalance.rocketmq import nameserver
from mqbalance.rocketmq.nameserver import NameServerClient, NameServerUnreachable, TopicNotFound
from mqbalance.rocketmq.remoting import RemotingCommand, decode

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rocketmq"
ROUTE = decode((FIXTURES / "5.3.3-route-orders.bin").read_bytes())
MISSING = decode((FIXTURES / "5.3.3-route-missing.bin").read_bytes())
ADDRESSES = ("10.0.0.1:9876", "10.0.0.2:9876", "10.0.0.3:9876", "10.0.0.4:9876")


class FakeNameServers:
    """Answers per address: ``route``, ``missing``, or refused (anything else)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, behaviour: dict[str, str]) -> None:
        self.behaviour = behaviour
        self.asked: list[str] = []
        monkeypatch.setattr(nameserver, "invoke", self.invoke)

    async def invoke(self, address: str, command: RemotingCommand, timeout: float) -> RemotingCommand:
        self.asked.append(address)
        what = self.behaviour.get(address, "route")
        if what == "route":
            return ROUTE
        if what == "missing":
            return MISSING
        raise ConnectionRefusedError(f"[Errno 111] Connect call failed {address}")


def route(client: NameServerClient) -> None:
    asyncio.run(client.topic_route("orders"))


def test_the_first_address_asked_is_random(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = FakeNameServers(monkeypatch, {})
    for seed in range(200):
        route(NameServerClient(ADDRESSES, rng=random.Random(seed)))
    firsts = Counter(servers.asked)
    assert set(firsts) == set(ADDRESSES)  # every address is somebody's first
    assert max(firsts.values()) < 100  # and none takes half of 200 clients (expected: 50 each)


def test_the_start_comes_from_the_injected_random(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = FakeNameServers(monkeypatch, {})
    expected = random.Random(7).randrange(len(ADDRESSES))
    client = NameServerClient(ADDRESSES, rng=random.Random(7))
    route(client)
    assert servers.asked == [ADDRESSES[expected]]
    assert client.answered == ADDRESSES[expected]


def test_one_that_answers_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = FakeNameServers(monkeypatch, {})
    client = NameServerClient(ADDRESSES, rng=random.Random(1))
    for _ in range(3):
        route(client)
    assert len(set(servers.asked)) == 1
    assert servers.asked[0] == client.answered


def test_a_failing_one_passes_the_request_on_in_turn_and_the_answering_one_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Starting at the second address: it and the third are dead, the fourth answers.
    servers = FakeNameServers(monkeypatch, {ADDRESSES[1]: "dead", ADDRESSES[2]: "dead"})
    client = NameServerClient(ADDRESSES, rng=FixedStart(1))
    route(client)
    assert servers.asked == [ADDRESSES[1], ADDRESSES[2], ADDRESSES[3]]
    servers.asked.clear()
    route(client)
    assert servers.asked == [ADDRESSES[3]]


def test_the_list_wraps_around(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = FakeNameServers(monkeypatch, {ADDRESSES[3]: "dead"})
    client = NameServerClient(ADDRESSES, rng=FixedStart(3))
    route(client)
    assert servers.asked == [ADDRESSES[3], ADDRESSES[0]]
    assert client.answered == ADDRESSES[0]


def test_when_none_answers_the_next_request_starts_one_further(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = FakeNameServers(monkeypatch, dict.fromkeys(ADDRESSES, "dead"))
    client = NameServerClient(ADDRESSES, rng=FixedStart(2))
    with pytest.raises(NameServerUnreachable) as caught:
        route(client)
    assert servers.asked == [ADDRESSES[2], ADDRESSES[3], ADDRESSES[0], ADDRESSES[1]]
    for address in ADDRESSES:
        assert address in str(caught.value)
    servers.asked.clear()
    with pytest.raises(NameServerUnreachable):
        route(client)
    assert servers.asked[0] == ADDRESSES[3]


def test_topic_not_found_is_believed_only_after_asking_every_one(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = FakeNameServers(monkeypatch, {ADDRESSES[0]: "missing", ADDRESSES[1]: "dead"})
    client = NameServerClient(ADDRESSES[:2], rng=FixedStart(0))
    with pytest.raises(TopicNotFound):
        route(client)
    assert servers.asked == [ADDRESSES[0], ADDRESSES[1]]


def test_a_single_address_needs_no_random() -> None:
    assert NameServerClient("10.0.0.1:9876")._first == 0


class FixedStart(random.Random):
    """A random whose ``randrange`` answers ``start``."""

    def __init__(self, start: int) -> None:
        super().__init__(0)
        self.start = start

    def randrange(self, *args: object, **kwargs: object) -> int:
        return self.start
