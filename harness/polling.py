"""Waiting for the world to catch up, with a deadline and a message naming what was awaited.

Every wait in the tests, the harness and the benchmarks follows the event it waits for: it polls a
condition and returns the moment it holds. Its deadline only says when to give up, so it is derived
from the work awaited (``work_timeout``: a fixed allowance plus so much per queue, pod or group)
and then scaled here, in one place, for the machine it runs on (``timeout_scale``):

- ``MQBALANCE_TIMEOUT_SCALE`` (a number, default 1) multiplies every deadline: set it on a machine
  known to be slow (``MQBALANCE_TIMEOUT_SCALE=3 make test``);
- the load allowance: when the 1-minute load average exceeds the CPUs, each runnable task gets
  about ``cpus / load`` of a CPU, so deadlines stretch by ``load / cpus`` (never below 1, at most
  ``MAX_LOAD_FACTOR``). It is read when a wait begins and read again when its deadline passes, so a
  wait that began on a quiet machine which then got busy is given the longer allowance too.

A longer deadline costs nothing when things work (the wait returns as soon as its condition holds);
it only delays the report of a real failure. ``wait_for`` is the harness's and the tests' one
waiting helper and applies the scale itself: a probe that sees the awaited thing die raises (a
process that exited), errors a probe may meet before the world is up are named (``retry_on``)
and the last one is reported, and ``details`` adds what explains a failure (the end of a log).
A wait that may give up and carry on (a best-effort clean-up) catches its ``error``. Subprocess
and HTTP calls that wait for the world take ``scaled(seconds)``; ``deadline(seconds)`` is for the
benchmarks' measuring loops, which count what arrived by a deadline rather than wait for one thing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SCALE_ENV = "MQBALANCE_TIMEOUT_SCALE"
MAX_LOAD_FACTOR = 10.0
"""The most the load allowance stretches a deadline (a load of 20 on 2 CPUs)."""


def env_scale() -> float:
    """``MQBALANCE_TIMEOUT_SCALE`` as a number (1 when unset or empty)."""
    text = os.environ.get(SCALE_ENV, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{SCALE_ENV}={text!r}: expected a positive number such as 2 or 1.5") from None
    if not value > 0:
        raise ValueError(f"{SCALE_ENV}={text!r}: expected a positive number such as 2 or 1.5")
    return value


def load_factor() -> float:
    """The 1-minute load average over the CPUs, between 1 and ``MAX_LOAD_FACTOR`` (1 where unknown)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return min(MAX_LOAD_FACTOR, max(1.0, load / (os.cpu_count() or 1)))


def timeout_scale() -> float:
    """How much every deadline is stretched now: the environment's scale times the load allowance."""
    return env_scale() * load_factor()


def scaled(seconds: float, at_most: float | None = None) -> float:
    """``seconds`` stretched for this machine now (for a subprocess's or an HTTP call's timeout), no
    more than ``at_most`` where the other side bounds it (a sidecar long-poll's --max-wait)."""
    stretched = seconds * timeout_scale()
    return stretched if at_most is None else min(stretched, at_most)


def deadline(seconds: float) -> float:
    """The ``time.monotonic()`` by which a hand-written polling loop allowing ``seconds`` gives up."""
    return time.monotonic() + scaled(seconds)


def work_timeout(base: float, per_unit: float = 0.0, units: float = 0) -> float:
    """A deadline derived from the work awaited: ``base`` seconds plus ``per_unit`` for each of
    ``units`` (queues of a Topic, pods, groups). Unscaled: ``wait_for`` scales it."""
    return base + per_unit * units


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 60.0,
    interval: float = 0.05,
    error: type[Exception] = AssertionError,
    *,
    retry_on: tuple[type[Exception], ...] = (),
    details: Callable[[], str] | None = None,
) -> T:
    """Call ``probe`` until it returns something truthy and return that.

    ``timeout`` is the allowance on an unloaded machine; the wait gives up after
    ``scaled(timeout)`` seconds (see the module's docstring) and raises ``error`` naming ``what``,
    the time waited and the last value seen (or the last of the ``retry_on`` errors the probe
    raised, which count as "not yet"), followed by ``details()`` where given. Any other exception
    from ``probe`` ends the wait at once.
    """
    started = time.monotonic()
    allowed = scaled(timeout)
    last: object = None
    while True:
        try:
            value = probe()
        except retry_on as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if value:
                return value
            last = value
        waited = time.monotonic() - started
        if waited > allowed:
            allowed = max(allowed, scaled(timeout))  # the machine may have got busier meanwhile
            if waited > allowed:
                stretch = allowed / timeout if timeout > 0 else 1.0
                message = (
                    f"timed out after {waited:.1f} s (allowance {timeout:g} s, x{stretch:.2g} for load and"
                    f" {SCALE_ENV}) waiting for {what} (last: {last!r})"
                )
                raise error(f"{message}:\n{details()}" if details is not None else message)
        time.sleep(interval)
