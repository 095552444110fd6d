"""An application that crashes is noticed by its closed connections, as a broker notices a closed channel.

The sidecar runs behind its real listener on a loopback port; applications are plain TCP
connections that send ``GET /v1/queues?client=ID`` and then close (a process that exits or is
killed: the kernel closes its sockets) or are closed by the sidecar (idle). The operator's side is
a recorder that keeps what the sidecar told it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from mqbalance.contract import Ack, AssignmentDocument, HandoverMode, LeaseTerms
from mqbalance.listener import Limits, serve
from mqbalance.producer import QueueSelector
from mqbalance.sidecar.app import create_app
from mqbalance.sidecar.presence import Presence
from mqbalance.sidecar.state import RETURN_CONFIRM_SECONDS, SidecarState
from tests.unit.sidecar.sidecar_support import OTHER, document, make_config

GROUP = "orders"
TERMS = LeaseTerms(20.0, 5.0)


class Recorder:
    """The releases ConfigMap as the operator reads it: the newest acknowledgement per group."""

    def __init__(self) -> None:
        self.acks: list[tuple[str, Ack]] = []
        self.changed = asyncio.Event()
        self.read = 0
        """Acknowledgements :meth:`next` returned."""

    async def record(self, group: str, ack: Ack) -> None:
        self.acks.append((group, ack))
        self.changed.set()

    async def next(self) -> Ack:
        """The acknowledgement recorded after the last one this returned (waits for it)."""
        while len(self.acks) == self.read:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)
        self.read += 1
        return self.acks[self.read - 1][1]


def handed(
    generation: int, *, member: bool = True, mode: HandoverMode = HandoverMode.RELEASE
) -> AssignmentDocument:
    doc = document(generation) if member else document(generation, {"orders": {OTHER: [("broker-a", 0)]}})
    return replace(doc, handover=mode, lease=TERMS)


class Sidecar:
    def __init__(self, state: SidecarState, recorder: Recorder | None, runner: web.AppRunner) -> None:
        self.state, self.recorder, self.runner = state, recorder, runner
        site = next(iter(runner.sites))
        self.port: int = site.port  # type: ignore[attr-defined]

    async def ask(self, client: str | None = None) -> tuple[asyncio.StreamWriter, dict[str, Any]]:
        """A connection that asks for this pod's queues (naming ``client``) and stays open."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        query = f"?client={client}" if client else ""
        writer.write(f"GET /v1/queues{query} HTTP/1.1\r\nHost: sidecar\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        return writer, json.loads(await reader.readexactly(length))

    async def queues(self) -> dict[str, Any]:
        writer, answer = await self.ask()
        writer.close()
        return answer


@pytest_asyncio.fixture
async def sidecar() -> AsyncIterator[Sidecar]:
    recorder = Recorder()
    async with _sidecar(recorder) as s:
        yield s


@contextlib.asynccontextmanager
async def _sidecar(recorder: Recorder | None, limits: Limits | None = None) -> AsyncIterator[Sidecar]:
    """A sidecar serving generation 1 (two queues for this pod, handover Release) behind its listener."""
    config = make_config(groups=(GROUP,))
    state = SidecarState(config.pod_name, config.groups, QueueSelector())
    state.publish(GROUP, handed(1))
    app = create_app(config, source=None, state=state, recorder=recorder)  # type: ignore[arg-type]
    runner = await serve(app, ["127.0.0.1"], 0, limits or Limits())
    try:
        yield Sidecar(state, recorder, runner)
    finally:
        await runner.cleanup()


def queue_count(answer: dict[str, Any]) -> int:
    return int(answer["queueCount"])


@pytest.mark.asyncio
async def test_an_application_whose_connections_close_is_gone_at_once(sidecar: Sidecar) -> None:
    """Its last connection closed by its side: the sidecar withholds the generation it serves from the
    pod and tells the operator at once (all released, absent), however many connections it had."""
    assert sidecar.recorder is not None
    first, answer = await sidecar.ask("10.0.0.1@1")
    assert queue_count(answer) == 2
    second, _ = await sidecar.ask("10.0.0.1@1")
    second.close()  # one of two connections: still there
    await asyncio.sleep(0.2)
    assert sidecar.recorder.acks == []
    assert queue_count(await sidecar.queues()) == 2
    first.close()
    assert await sidecar.recorder.next() == Ack(1, all=True, absent=True)
    answer = await sidecar.queues()
    assert (queue_count(answer), answer["absent"], answer["fenced"]) == (0, True, True)
    assert sidecar.state.metrics.application_gone._value.get() == 1


@pytest.mark.asyncio
async def test_a_connection_the_sidecar_closes_says_nothing_of_the_application() -> None:
    """A frozen application (SIGSTOP, a long GC) closes nothing: its idle connection, closed by the
    sidecar, does not make it gone."""
    recorder = Recorder()
    async with _sidecar(recorder, Limits(idle_timeout=0.2, read_timeout=0.2)) as sidecar:
        writer, _ = await sidecar.ask("10.0.0.1@1")
        await asyncio.sleep(1.5)  # the sweep closes it
        assert sidecar.runner.server is not None
        assert sidecar.state.presence.clients() == 0, "the listener closed the idle connection"
        assert recorder.acks == []
        assert queue_count(await sidecar.queues()) == 2
        writer.close()


@pytest.mark.asyncio
async def test_the_generation_served_when_it_went_stays_withheld_until_the_next(sidecar: Sidecar) -> None:
    """Back before the operator answered the absence (generation 1 still gives it queues): still
    nothing, and its release is recorded as the absence again, so the operator cannot miss it. The next
    generation (the operator's, without the pod) is served, and the return is recorded."""
    assert sidecar.recorder is not None
    writer, _ = await sidecar.ask("10.0.0.1@1")
    writer.close()
    assert await sidecar.recorder.next() == Ack(1, all=True, absent=True)
    again, answer = await sidecar.ask("10.0.0.1@1")  # the restarted container
    assert queue_count(answer) == 0
    assert answer["absent"] is True
    group = sidecar.state.groups[GROUP]
    assert group.ack_for(1, False) == Ack(1, all=True, absent=True)
    await asyncio.sleep(RETURN_CONFIRM_SECONDS + 0.2)  # its connection lasted: back, 1 still withheld
    assert not sidecar.state.presence.absent
    assert (await sidecar.queues())["absent"] is True
    assert group.ack_for(1, False) == Ack(1, all=True, absent=True)
    sidecar.state.publish(GROUP, handed(2, member=False))
    assert await sidecar.recorder.next() == Ack(2)
    answer = await sidecar.queues()
    assert "absent" not in answer
    assert answer["isMember"] is False
    assert group.ack_for(2, False) == Ack(2)
    sidecar.state.publish(GROUP, handed(3))  # counted in again
    assert queue_count(await sidecar.queues()) == 2
    again.close()


@pytest.mark.asyncio
async def test_while_it_stays_away_each_new_generation_is_withheld_and_told(sidecar: Sidecar) -> None:
    """Each generation served while the application is away is told as absent (withheld if it gives
    the pod anything); once back, the generation served is told and served."""
    assert sidecar.recorder is not None
    writer, _ = await sidecar.ask("10.0.0.1@1")
    writer.close()
    assert await sidecar.recorder.next() == Ack(1, all=True, absent=True)
    sidecar.state.publish(GROUP, handed(2))  # computed before the operator read the absence
    assert await sidecar.recorder.next() == Ack(2, all=True, absent=True)
    assert queue_count(await sidecar.queues()) == 0
    # The operator's answer, without it: nothing to withhold, but the absence is told again, or the
    # operator would take the older one for stale and count it in again (a member flapping in and out).
    sidecar.state.publish(GROUP, handed(3, member=False))
    assert await sidecar.recorder.next() == Ack(3, all=True, absent=True)
    back, _ = await sidecar.ask("10.0.0.1@2")  # back once its connection lasts; nothing given: served at once
    assert sidecar.state.groups[GROUP].ack_for(3, False) == Ack(3, all=True, absent=True), "not back yet"
    assert await sidecar.recorder.next() == Ack(3)
    assert "absent" not in await sidecar.queues()
    sidecar.state.publish(GROUP, handed(4))
    await asyncio.sleep(0.1)
    assert len(sidecar.recorder.acks) == 4, "present: nothing more to tell"
    back.close()


@pytest.mark.asyncio
async def test_without_an_operator_to_tell_nothing_is_withheld() -> None:
    """An assignment from a file, or requests that name no client: no absence."""
    async with _sidecar(None) as sidecar:
        writer, _ = await sidecar.ask("10.0.0.1@1")
        writer.close()
        await asyncio.sleep(0.2)
        assert queue_count(await sidecar.queues()) == 2
    recorder = Recorder()
    async with _sidecar(recorder) as sidecar:
        writer, _ = await sidecar.ask()
        writer.close()
        await asyncio.sleep(0.2)
        assert recorder.acks == []
        assert queue_count(await sidecar.queues()) == 2


@pytest.mark.asyncio
async def test_an_orderly_group_withholds_nothing(sidecar: Sidecar) -> None:
    """An orderly consumer that lost its connection may still hold the broker's lock mid-batch: its
    queues wait for the lock, not for the sidecar's word."""
    assert sidecar.recorder is not None
    sidecar.state.publish(GROUP, handed(2, mode=HandoverMode.ORDERLY))
    writer, _ = await sidecar.ask("10.0.0.1@1")
    writer.close()
    await asyncio.sleep(0.2)
    assert sidecar.state.presence.absent
    assert sidecar.recorder.acks == []
    assert queue_count(await sidecar.queues()) == 2


@pytest.mark.asyncio
async def test_a_killed_applications_last_request_is_no_return(sidecar: Sidecar) -> None:
    """A process killed just after it sent a request on a new connection: the sidecar may read that
    request after its other connections' closes. It is no return (the pod would be counted in and out
    again): its connection closes before the return is confirmed."""
    assert sidecar.recorder is not None
    long_poll, _ = await sidecar.ask("10.0.0.1@1")
    long_poll.close()
    assert await sidecar.recorder.next() == Ack(1, all=True, absent=True)
    late, _ = await sidecar.ask("10.0.0.1@1")
    late.close()
    await asyncio.sleep(RETURN_CONFIRM_SECONDS + 0.3)
    assert sidecar.state.presence.absent
    assert len(sidecar.recorder.acks) == 1, sidecar.recorder.acks
    assert sidecar.state.metrics.application_gone._value.get() == 1
    assert (await sidecar.queues())["absent"] is True


def test_presence_counts_connections_and_only_the_clients_own_closes() -> None:
    presence = Presence()
    a, b = object(), object()
    assert presence.connected("x", a) is False
    presence.connected("y", b)
    assert presence.closed("x", a, by_peer=True) is False, "y is still connected"
    assert presence.closed("y", b, by_peer=False) is False, "closed by the sidecar"
    assert presence.clients() == 0
    assert not presence.absent
    presence.connected("x", a)
    assert presence.closed("x", a, by_peer=True) is True
    assert presence.closed("x", a, by_peer=True) is False, "told once"
    assert presence.connected("x", b) is True, "a request while absent"
    assert presence.closed("x", b, by_peer=True) is False, "closed before its return was confirmed"
    assert presence.confirm() is False, "still absent"
    presence.connected("x", a)
    assert presence.confirm() is True, "back"
    assert not presence.absent
    assert presence.confirm() is False, "told once"
