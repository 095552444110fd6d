"""A small client of the sidecar's API for Python consumers and producers.

Standard library only (``urllib``), so an application needs nothing beyond
mqbalance itself (the release's wheel without extras: no kopf, kubernetes or aiohttp),
and can copy this file if it does not want even that::

    client = SidecarClient()                      # $MQBALANCE_URL, else http://127.0.0.1:8081
    view = client.queues()
    client.release(view["generation"])            # at start this pod holds nothing
    while True:
        consume(view["queues"])                   # stop what is not in it, commit
        released = view["generation"]
        client.release(released)                  # the handover may assign the rest now
        while view["generation"] == released:     # one acknowledgement a generation
            view = client.wait_for_change(released, timeout=client.grant_poll_timeout(60))

On shutdown, after committing: ``client.release(view["generation"], all=True)``.

With a handover (Release, Orderly) a pod's queues are granted for a bounded time: check the grant
before handing each batch to the application, and stop processing every queue while it is not
valid (the sidecar is fenced, or has not been heard from within the grant); keep what was fetched
unprocessed until it is fresh again::

    for batch in fetched_batches():
        if not client.await_grant(timeout=1.0, min_remaining=expected_batch_seconds):
            continue                              # hand nothing out; fetch nothing new meanwhile
        process(batch)

Long-poll with ``timeout=client.grant_poll_timeout(60)`` so an unchanged answer renews the grant
well before it runs out.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8081"
URL_ENV = "MQBALANCE_URL"
"""The environment variable naming the sidecar's URL (examples/consumer-deployment.yaml sets it)."""


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """``$MQBALANCE_URL`` when set and not blank, else :data:`DEFAULT_URL`."""
    value = (os.environ if environ is None else environ).get(URL_ENV, "").strip()
    return value or DEFAULT_URL


class SidecarError(Exception):
    """The sidecar answered with an error (``status`` is the HTTP status, 0 if unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"sidecar: {message} (HTTP {status})" if status else f"sidecar: {message}")
        self.status = status
        self.message = message


class SidecarClient:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        group: str | None = None,
        timeout: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``base_url`` wins; without it, ``$MQBALANCE_URL`` when set, else ``http://127.0.0.1:8081``."""
        self.base_url = (default_url() if base_url is None else base_url).rstrip("/")
        self.group = group
        """The ConsumerGroup resource to ask about; needed only when the sidecar serves several."""
        self.timeout = timeout
        self._monotonic = monotonic
        self._viewed = False
        self._fenced = False
        self._grant_until: float | None = None
        """Monotonic deadline of the last view's grant; None when it had none (no handover)."""

    # -- time-bounded ownership ------------------------------------------------

    def grant_valid(self) -> bool:
        """Whether this pod may still process the queues of the last view (:meth:`queues` or
        :meth:`wait_for_change`): False before any view, while fenced, and once the view's
        ``grant.validForMs`` has run out on this process's monotonic clock (counted from when the
        request was sent: an answer read late grants no more), even if the sidecar cannot be
        reached any more. Check it before handing each batch to the application; when False, stop
        processing every queue and ask again.
        A view without a grant (handover Off) is valid until replaced."""
        if not self._viewed or self._fenced:
            return False
        return self._grant_until is None or self._monotonic() < self._grant_until

    def grant_remaining(self) -> float | None:
        """Seconds the last view's grant still lasts (0 when fenced or expired); None without a grant."""
        if self._fenced:
            return 0.0
        if self._grant_until is None:
            return None
        return max(0.0, self._grant_until - self._monotonic())

    def await_grant(
        self,
        timeout: float,
        *,
        min_remaining: float = 0.0,
        interval: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> bool:
        """Whether a batch may start now: the grant is valid and lasts at least ``min_remaining``
        more seconds (a batch must not start when the grant would run out before it ends). While
        it does not, ask the sidecar again every ``interval`` seconds (:meth:`queues`: the answer
        may carry a new generation, so look at the last view before processing), for at most
        ``timeout`` seconds; an unreachable sidecar counts as no grant. False when the grant is
        still not good enough at the end: hand nothing to the application."""
        deadline = self._monotonic() + timeout
        while True:
            if self._grant_lasts(min_remaining):
                return True
            if self._monotonic() >= deadline:
                return False
            with contextlib.suppress(SidecarError):  # unreachable: the grant runs out on this clock
                self.queues()
            if self._grant_lasts(min_remaining):
                return True
            left = deadline - self._monotonic()
            if left <= 0:
                return False
            sleep(min(interval, left))

    def _grant_lasts(self, seconds: float) -> bool:
        if not self.grant_valid():
            return False
        remaining = self.grant_remaining()
        return remaining is None or remaining > seconds

    def grant_poll_timeout(self, timeout: float) -> float:
        """The long-poll timeout to use after the last view: ``timeout``, or with a grant a third of
        what it still lasts (at least a second), so an unchanged answer renews it in time."""
        remaining = self.grant_remaining()
        if remaining is None:
            return timeout
        return min(timeout, max(1.0, remaining / 3))

    def _note_view(self, view: dict[str, Any], asked: float) -> dict[str, Any]:
        # Counted from when the request was sent, not when the answer was read: an answer that
        # waited in the socket while this process was paused carries a grant that began earlier.
        self._viewed = True
        self._fenced = view.get("fenced") is True
        grant = view.get("grant")
        valid_ms = grant.get("validForMs") if isinstance(grant, dict) else None
        if isinstance(valid_ms, int | float) and not isinstance(valid_ms, bool):
            self._grant_until = asked + max(0.0, valid_ms) / 1000.0
        else:
            self._grant_until = None
        return view

    # -- consumer side ---------------------------------------------------------

    def queues(self) -> dict[str, Any]:
        """This pod's queues per topic, with ``generation`` and ``strategy`` (and, with a handover,
        ``fenced`` and ``grant``: see :meth:`grant_valid`)."""
        asked = self._monotonic()
        return self._note_view(self._get("/v1/queues", {}), asked)

    def wait_for_change(self, after_generation: int, timeout: float = 30.0) -> dict[str, Any]:
        """Like :meth:`queues`, but waits until the generation differs from ``after_generation``.

        Returns the unchanged view when ``timeout`` passes first; compare its
        ``generation``. Pass -1 to wait for the first assignment.
        """
        params = {"after": str(after_generation), "timeout": f"{timeout:g}"}
        asked = self._monotonic()
        return self._note_view(self._get("/v1/queues", params, wait=timeout), asked)

    def assignment(self) -> dict[str, Any]:
        """The whole group's assignment document."""
        return self._get("/v1/assignment", {})

    def release(
        self,
        generation: int,
        *,
        all: bool = False,
        applied_ms: float | None = None,
        committed_ms: float | None = None,
    ) -> dict[str, Any]:
        """Tell the operator this pod holds nothing outside generation ``generation``'s share (or, with
        ``all``, nothing at all): call it after stopping and committing the queues it lost.

        Harmless when the group has no handover (``recorded`` is then false). ``applied_ms`` and
        ``committed_ms`` (optional) time this application's steps of the move for its trace:
        milliseconds from reading the generation to stopping the revoked queues' fetching, and to
        committing their last offsets (``mqbalance_sidecar_move_step_seconds``).
        """
        body: dict[str, Any] = {"generation": generation}
        if all:
            body["all"] = True
        if applied_ms is not None:
            body["appliedMs"] = applied_ms
        if committed_ms is not None:
            body["committedMs"] = committed_ms
        if self.group is not None:
            body["group"] = self.group
        return self._request("POST", "/v1/release", body)

    def report_consumed(
        self, generation: int, consumed_ms: float, pulled_ms: float | None = None
    ) -> dict[str, Any]:
        """For the trace of a move: the first message of a queue ``generation`` gave this pod was
        consumed ``consumed_ms`` after reading that generation, and (optional) the first pull of such
        a queue was sent ``pulled_ms`` after it (``POST /v1/trace``)."""
        body: dict[str, Any] = {"generation": generation, "consumedMs": consumed_ms}
        if pulled_ms is not None:
            body["pulledMs"] = pulled_ms
        if self.group is not None:
            body["group"] = self.group
        return self._request("POST", "/v1/trace", body)

    def drain(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until this pod has nothing left to hand over (``drained``), at most ``timeout`` seconds."""
        return self._get("/v1/drain", {"timeout": f"{timeout:g}"}, wait=timeout)

    def ready(self) -> bool:
        try:
            self._request("GET", "/readyz")
        except SidecarError as e:
            if e.status == 503:
                return False
            raise
        return True

    # -- producer side ---------------------------------------------------------

    def route(self, topic: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/topics/{_quote(topic)}/route")

    def select_queue(
        self,
        topic: str,
        *,
        last_broker: str | None = None,
        selector: str | None = None,
        sharding_key: str | None = None,
        fault_tolerance: bool | None = None,
    ) -> dict[str, Any]:
        """``{"topic", "broker", "queueId"}`` for the next send; on a retry pass ``last_broker``."""
        body = {
            "lastBroker": last_broker,
            "selector": selector,
            "shardingKey": sharding_key,
            "faultTolerance": fault_tolerance,
        }
        return self._request(
            "POST", f"/v1/topics/{_quote(topic)}/select", {k: v for k, v in body.items() if v is not None}
        )

    def report(
        self, broker: str, latency_ms: float, *, failed: bool = False, reachable: bool = True
    ) -> dict[str, Any]:
        """Report a send's outcome; returns the broker's fault state after it."""
        body = {"broker": broker, "latencyMs": latency_ms, "failed": failed, "reachable": reachable}
        return self._request("POST", "/v1/sends", body)

    def faults(self) -> dict[str, Any]:
        return self._request("GET", "/v1/faults")

    # -- plumbing --------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str], *, wait: float = 0.0) -> dict[str, Any]:
        if self.group is not None:
            params = {"group": self.group, **params}
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return self._request("GET", path + query, wait=wait)

    def _request(self, method: str, path: str, body: Any = None, *, wait: float = 0.0) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            # A long-poll may legitimately take its whole wait before answering.
            with urllib.request.urlopen(request, timeout=self.timeout + wait) as resp:
                result: dict[str, Any] = json.loads(resp.read())
                return result
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = str(json.loads(raw)["error"])
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace")[:300] or e.reason
            raise SidecarError(e.code, message) from None
        except (urllib.error.URLError, OSError) as e:
            raise SidecarError(0, f"cannot reach {self.base_url}: {e}") from None


def _quote(topic: str) -> str:
    return urllib.parse.quote(topic, safe="")
