"""The Python client checks the grant before a batch: waits for a fresh one, starts none it would outlive."""

from __future__ import annotations

from typing import Any

from mqbalance.sidecar.client import SidecarClient, SidecarError
from tests.unit.sidecar.sidecar_support import FakeClock


class Sidecar:
    """Answers ``GET /v1/queues`` from a list; an exception in the list is raised (unreachable)."""

    def __init__(self, client: SidecarClient) -> None:
        self.answers: list[dict[str, Any] | SidecarError] = []
        self.asked = 0
        client._get = self.get  # type: ignore[method-assign]

    def get(self, path: str, params: dict[str, str], *, wait: float = 0.0) -> dict[str, Any]:
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, SidecarError):
            raise answer
        return answer


def granted(ms: int, generation: int = 3) -> dict[str, Any]:
    return {"generation": generation, "queues": {"t": []}, "fenced": False, "grant": {"validForMs": ms}}


def answered(answer: dict[str, Any]) -> tuple[FakeClock, SidecarClient, Sidecar]:
    """A client on a fake clock whose sidecar gave ``answer`` to its first ``GET /v1/queues``."""
    clock = FakeClock(10.0)
    client = SidecarClient("http://127.0.0.1:1", monotonic=clock)
    sidecar = Sidecar(client)
    sidecar.answers = [answer]
    client.queues()
    return clock, client, sidecar


FENCED: dict[str, Any] = {"generation": 3, "queues": {"t": []}, "fenced": True, "grant": {"validForMs": 0}}


def test_a_batch_does_not_start_when_the_grant_would_run_out_before_it_ends() -> None:
    clock, client, sidecar = answered(granted(4000))
    assert client.await_grant(0.0, min_remaining=3.0, sleep=clock.advance)
    clock.advance(1.5)
    # 2.5 s left: a batch that may take 3 s must not start; the sidecar is unreachable meanwhile.
    sidecar.answers = [SidecarError(0, "unreachable")]
    assert not client.await_grant(1.0, min_remaining=3.0, sleep=clock.advance)
    assert sidecar.asked > 1, "asked the sidecar again while waiting"
    assert client.await_grant(0.0, min_remaining=0.5, sleep=clock.advance), "a short batch still fits"


def test_await_grant_waits_through_a_fence_and_goes_on_when_the_grant_is_fresh() -> None:
    clock, client, sidecar = answered(FENCED)
    assert not client.await_grant(0.5, sleep=clock.advance), "fenced: nothing may be processed"
    sidecar.answers = [FENCED, FENCED, granted(5000)]
    assert client.await_grant(2.0, sleep=clock.advance)
    assert client.grant_remaining() == 5.0


def test_an_expired_grant_is_not_valid_even_if_the_sidecar_never_answers_again() -> None:
    clock, client, sidecar = answered(granted(1000))
    sidecar.answers = [SidecarError(0, "unreachable")]
    clock.advance(1.0)
    assert not client.await_grant(5.0, sleep=clock.advance)
    assert clock.now >= 16.0, "waited its whole timeout"


def test_the_long_poll_renews_the_grant_in_time() -> None:
    clock, client, sidecar = answered({"generation": 3, "queues": {}})
    assert client.grant_poll_timeout(60) == 60, "no grant: the caller's timeout"
    sidecar.answers = [granted(9000)]
    client.queues()
    assert client.grant_poll_timeout(60) == 3.0
    clock.advance(8.5)
    assert client.grant_poll_timeout(60) == 1.0, "at least a second"


def test_an_answer_read_late_grants_no_more_than_from_when_it_was_asked_for() -> None:
    """A process paused (SIGSTOP, a long GC) while a long-poll's answer waits in its socket reads the
    answer late: the grant in it was counted by the sidecar when it answered, so it may already be
    over. Counted from when the request was sent, it never outlives what the sidecar granted."""
    clock = FakeClock(10.0)
    client = SidecarClient("http://127.0.0.1:1", monotonic=clock)
    sidecar = Sidecar(client)
    sidecar.answers = [granted(4000)]
    real_get = sidecar.get

    def paused_get(path: str, params: dict[str, str], *, wait: float = 0.0) -> dict[str, Any]:
        answer = real_get(path, params, wait=wait)
        clock.advance(8.0)  # answered at once, read eight seconds later
        return answer

    client._get = paused_get  # type: ignore[method-assign]
    client.wait_for_change(3, timeout=1.5)
    assert not client.grant_valid(), "a four-second grant read eight seconds late is over"
    assert client.grant_remaining() == 0.0
