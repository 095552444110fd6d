"""Time-bounded ownership in the sidecar: renewals confirm contact from when they were sent, the
grant runs out ``lease.seconds`` later on the monotonic clock, and then the pod is fenced (no
queues served, long-polls woken, metric set) until a renewal succeeds again."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest
from pytest_aiohttp import AiohttpClient

from mqbalance.contract import (
    MAX_MEMBER_CLIENTS,
    AssignmentDocument,
    HandoverMode,
    LeaseTerms,
    member_clients,
    member_lease_name,
)
from mqbalance.kube import ApiError
from mqbalance.producer import QueueSelector
from mqbalance.sidecar.app import create_app
from mqbalance.sidecar.state import SidecarState
from mqbalance.sidecar.watch import MemberLease
from tests.unit.sidecar.sidecar_support import POD, FakeClock, document, make_config

pytestmark = pytest.mark.asyncio
GROUP = "orders-consumer"
TERMS = LeaseTerms(20.0, 5.0)


def leased(generation: int, terms: LeaseTerms | None = TERMS) -> AssignmentDocument:
    return replace(document(generation), handover=HandoverMode.RELEASE, lease=terms)


def new_state(clock: FakeClock, *, enabled: bool = True) -> SidecarState:
    state = SidecarState(POD, [GROUP], QueueSelector(), clock=clock, monotonic=clock)
    state.grant.enabled = enabled
    return state


def view(state: SidecarState) -> dict[str, Any]:
    group = state.groups[GROUP]
    assert group.served is not None
    answer = json.loads(group.queues_body(group.served))
    assert isinstance(answer, dict)
    return answer


def fenced_gauge(state: SidecarState) -> float | None:
    return state.metrics.registry.get_sample_value("mqbalance_sidecar_fenced", {"group": GROUP})


async def test_the_grant_runs_out_lease_seconds_after_the_last_confirmed_renewal() -> None:
    clock = FakeClock(500.0)
    state = new_state(clock)
    state.publish(GROUP, leased(3))
    # No renewal yet: fenced from the start.
    first = view(state)
    assert (first["fenced"], first["queueCount"], first["grant"]) == (True, 0, {"validForMs": 0})
    assert first["queues"] == {"orders": []}
    assert first["generation"] == 3
    assert fenced_gauge(state) == 1.0
    state.confirm_contact(500.0)
    ok = view(state)
    assert (ok["fenced"], ok["queueCount"], ok["grant"]) == (False, 2, {"validForMs": 20000})
    assert fenced_gauge(state) == 0.0
    clock.advance(19.5)
    assert view(state)["grant"]["validForMs"] == 500
    assert not state.groups[GROUP].fenced()
    clock.advance(0.5)
    assert state.groups[GROUP].fenced()
    assert view(state)["fenced"] is True
    state.check_fences()
    assert fenced_gauge(state) == 1.0
    # An older renewal's success changes nothing; a renewal sent now un-fences, serving the current document.
    state.confirm_contact(499.0)
    assert view(state)["fenced"] is True
    state.confirm_contact(clock.now - 1.0)
    again = view(state)
    assert (again["fenced"], again["queueCount"], again["grant"]["validForMs"]) == (False, 2, 19000)
    assert fenced_gauge(state) == 0.0


async def test_no_grant_without_lease_terms_or_without_renewals() -> None:
    clock = FakeClock()
    off = new_state(clock)
    off.publish(GROUP, document(1))  # an Off document has no lease terms
    assert "grant" not in view(off)
    assert "fenced" not in view(off)
    assert view(off)["queueCount"] == 2
    files = new_state(clock, enabled=False)  # assignments from files or a test: no member Lease
    files.publish(GROUP, leased(1))
    assert "grant" not in view(files)
    assert view(files)["queueCount"] == 2


async def test_a_long_poll_wakes_when_the_pod_is_fenced_and_when_it_serves_again() -> None:
    clock = FakeClock(100.0)
    state = new_state(clock)
    state.publish(GROUP, leased(4))
    state.confirm_contact(100.0)
    group = state.groups[GROUP]
    waiting = asyncio.create_task(group.wait_change(4, 30.0))
    await asyncio.sleep(0)
    clock.advance(20.0)
    state.check_fences()
    served = await asyncio.wait_for(waiting, 5)
    assert served is not None
    assert served.generation == 4
    assert group.fenced()
    waiting = asyncio.create_task(group.wait_change(4, 30.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    state.confirm_contact(clock.now)
    await asyncio.wait_for(waiting, 5)
    assert not group.fenced()


async def test_the_fence_watcher_fences_at_the_expiry_on_its_own() -> None:
    state = SidecarState(POD, [GROUP], QueueSelector())  # the real monotonic clock
    state.grant.enabled = True
    state.publish(GROUP, leased(2, LeaseTerms(0.3, 0.1)))
    state.confirm_contact(time.monotonic())
    watcher = asyncio.create_task(state.watch_fences())
    try:
        group = state.groups[GROUP]
        assert fenced_gauge(state) == 0.0
        await asyncio.wait_for(group.wait_change(2, 10.0), 5)
        assert group.fenced()
        assert fenced_gauge(state) == 1.0
    finally:
        watcher.cancel()


async def test_get_queues_serves_nothing_while_fenced(aiohttp_client: AiohttpClient) -> None:
    clock = FakeClock(10.0)
    config = make_config()
    state = SidecarState(config.pod_name, config.groups, QueueSelector(), clock=clock, monotonic=clock)
    state.grant.enabled = True
    client = await aiohttp_client(create_app(config, source=None, state=state))
    state.publish(config.default_group, leased(5))
    state.confirm_contact(10.0)
    body = await (await client.get("/v1/queues")).json()
    assert (body["fenced"], body["queueCount"], body["grant"]["validForMs"]) == (False, 2, 20000)
    clock.advance(25.0)
    body = await (await client.get("/v1/queues?after=1")).json()
    assert (body["fenced"], body["queueCount"], body["queues"]) == (True, 0, {"orders": []})


class FakeKube:
    """Answers a LeaseLock's get/create/replace; the clock moves while a request is under way."""

    def __init__(self, clock: FakeClock, delay: float = 0.0) -> None:
        self.clock, self.delay = clock, delay
        self.lease: dict[str, Any] | None = None
        self.fail = False
        self.created: list[dict[str, Any]] = []
        self.document = leased(1)
        """What the group's ConfigMap holds."""

    def _answer(self) -> None:
        self.clock.advance(self.delay)
        if self.fail:
            raise ApiError(0, "GET: connection refused")

    async def get(self, path: str) -> dict[str, Any]:
        self._answer()
        if "/configmaps/" in path:
            return {"data": {"assignment.json": self.document.encode()}}
        if self.lease is None:
            raise ApiError(404, "not found", "NotFound")
        return json.loads(json.dumps(self.lease))  # type: ignore[no-any-return]

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._answer()
        self.created.append(body)
        self.lease = dict(body)
        return body

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._answer()
        self.lease = dict(body)
        return body


async def test_a_renewal_confirms_contact_from_when_it_was_sent() -> None:
    clock = FakeClock(1000.0)
    state = new_state(clock)
    state.publish(GROUP, leased(1))
    kube = FakeKube(clock, delay=3.0)  # each request takes 3 s
    member = MemberLease(kube, "shop", POD, "uid-1", monotonic=clock)  # type: ignore[arg-type]
    assert await member.renew_once(state, 20.0, 5.0)
    assert state.grant.confirmed_at == 1000.0, "counted from the send, not from the answer 6 s later"
    (created,) = kube.created
    assert created["metadata"]["name"] == f"{POD}-mqbalance-member"
    assert created["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": "uid-1"}
    ]
    assert created["spec"]["holderIdentity"] == POD
    assert created["spec"]["leaseDurationSeconds"] == 20
    sent = clock.now
    assert await member.renew_once(state, 20.0, 5.0)  # the Lease exists: renewed in place
    assert state.grant.confirmed_at == sent
    kube.fail = True
    assert not await member.renew_once(state, 20.0, 5.0)
    assert state.grant.confirmed_at == sent
    samples = state.metrics.registry.get_sample_value
    assert samples("mqbalance_sidecar_lease_renewals_total", {"result": "ok"}) == 2.0
    assert samples("mqbalance_sidecar_lease_renewals_total", {"result": "failed"}) == 1.0
    # Without the pod's uid the Lease has no owner.
    bare = FakeKube(clock)
    await MemberLease(bare, "shop", POD, monotonic=clock).renew_once(state, 20.0, 5.0)  # type: ignore[arg-type]
    assert "ownerReferences" not in bare.created[0]["metadata"]


async def test_after_a_lost_renewal_the_document_is_read_again_before_serving() -> None:
    clock = FakeClock(1000.0)
    state = new_state(clock)
    state.publish(GROUP, leased(1))
    kube = FakeKube(clock)
    member = MemberLease(kube, "shop", POD, groups=(GROUP,), monotonic=clock)  # type: ignore[arg-type]
    assert await member.renew_once(state, 20.0, 5.0)
    kube.fail = True  # cut off: the watch misses generation 2, which takes this pod's queues
    assert not await member.renew_once(state, 20.0, 5.0)
    clock.advance(25.0)
    state.check_fences()
    assert state.groups[GROUP].fenced()
    kube.fail = False
    kube.document = leased(2, TERMS)
    kube.document = replace(kube.document, topics={"orders": {POD: (), **{}}})
    assert await member.renew_once(state, 20.0, 5.0)
    back = view(state)
    assert (back["fenced"], back["generation"], back["queueCount"]) == (False, 2, 0), (
        "serving again means serving the current document, not the one from before the cut"
    )


async def test_the_member_lease_name_fits_a_kubernetes_name() -> None:
    assert member_lease_name("orders-0") == "orders-0-mqbalance-member"
    long = member_lease_name("p" * 253)
    assert len(long) == 253
    assert long.endswith("-mqbalance-member")
    assert long != member_lease_name("p" * 252 + "q"), "distinct pods keep distinct Leases"


async def test_the_python_client_checks_the_grant_on_its_own_clock() -> None:
    from mqbalance.sidecar.client import SidecarClient

    clock = FakeClock(50.0)
    answers: list[dict[str, Any]] = []
    client = SidecarClient("http://127.0.0.1:1", monotonic=clock)

    def answer(path: str, params: dict[str, str], *, wait: float = 0.0) -> dict[str, Any]:
        return answers.pop(0)

    client._get = answer  # type: ignore[method-assign]
    assert not client.grant_valid(), "no view read yet"
    answers.append({"generation": 3, "queues": {}, "fenced": False, "grant": {"validForMs": 4000}})
    client.queues()
    assert client.grant_valid()
    assert client.grant_remaining() == 4.0
    clock.advance(3.999)
    assert client.grant_valid(), "still within the grant though the sidecar is not asked again"
    clock.advance(0.001)
    assert not client.grant_valid()
    assert client.grant_remaining() == 0.0
    answers.append({"generation": 3, "queues": {}, "fenced": True, "grant": {"validForMs": 0}})
    client.wait_for_change(3, 1)
    assert not client.grant_valid()
    answers.append({"generation": 4, "queues": {}})  # handover Off: no grant, no time bound
    client.queues()
    assert client.grant_valid()
    assert client.grant_remaining() is None


async def test_the_clients_the_applications_named_are_written_to_the_member_lease(
    aiohttp_client: AiohttpClient,
) -> None:
    """``GET /v1/queues?client=ID`` names the asking consumer's RocketMQ client; the next renewal
    writes every one named (the newest MAX_MEMBER_CLIENTS) into the Lease, where the operator reads
    them to release a stopped pod's broker locks."""
    clock = FakeClock(1000.0)
    config = make_config()
    state = SidecarState(config.pod_name, config.groups, QueueSelector(), clock=clock, monotonic=clock)
    state.publish(config.default_group, leased(1))
    client = await aiohttp_client(create_app(config, source=None, state=state))
    for cid in ("10.0.0.1@123#4", "10.0.0.1@123#4", "10.0.0.1@456#7"):
        assert (await client.get("/v1/queues", params={"client": cid, "after": "-1"})).status == 200
    bad = await client.get("/v1/queues", params={"client": "has space"})
    assert bad.status == 400
    assert "client must be a RocketMQ client id" in (await bad.json())["error"]
    kube = FakeKube(clock)
    member = MemberLease(kube, "shop", POD, monotonic=clock)  # type: ignore[arg-type]
    assert await member.renew_once(state, 20.0, 5.0)
    assert kube.lease is not None
    assert member_clients(kube.lease["metadata"]["annotations"]) == ("10.0.0.1@123#4", "10.0.0.1@456#7")
    for i in range(MAX_MEMBER_CLIENTS):
        await client.get("/v1/queues", params={"client": f"10.0.0.2@{i}"})
    clock.advance(5.0)
    assert await member.renew_once(state, 20.0, 5.0)  # renewed in place, the annotation updated
    named = member_clients(kube.lease["metadata"]["annotations"])
    assert named == tuple(f"10.0.0.2@{i}" for i in range(MAX_MEMBER_CLIENTS))


@pytest.mark.parametrize("steps", range(6))
async def test_the_fence_watcher_stops_when_cancelled_even_as_the_grant_changes(steps: int) -> None:
    """The sidecar's shutdown cancels the fence watcher and waits for it. A cancellation that arrives
    while a renewal (or a new generation) is waking the watcher must still end it: Python 3.11's
    ``asyncio.wait_for`` returned the finished wait instead, the loop went on and the sidecar never
    exited on SIGTERM. ``steps`` places the cancellation at each point of the wake-up."""
    state = new_state(FakeClock(500.0))
    state.publish(GROUP, leased(3))
    state.confirm_contact(500.0)  # the grant lasts: the watcher waits with a timeout
    watcher = asyncio.create_task(state.watch_fences())
    for _ in range(3):
        await asyncio.sleep(0)  # waiting for the grant to change
    state.grant.confirm(500.0)
    for _ in range(steps):
        await asyncio.sleep(0)
    watcher.cancel()
    done, _ = await asyncio.wait({watcher}, timeout=5)
    assert done, f"the fence watcher ran on after it was cancelled {steps} loop steps into its wake-up"
    assert watcher.cancelled()
