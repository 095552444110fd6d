"""What a test starts and stops: :class:`Service`, and the one registry of services stopped when
the interpreter exits or is told to stop (:func:`stop_at_exit`)."""

from __future__ import annotations

import abc
import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Self


class Service(abc.ABC):
    """What the harness starts for a test and stops after it (a control plane, real nodes, RocketMQ,
    Spark, kwok): ``with`` starts it and stops it."""

    @abc.abstractmethod
    def start(self) -> Self: ...

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop everything the service started; safe to call more than once."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_live: dict[int, Callable[[], None]] = {}
"""The stop of every service that runs, by the service's id, in the order they started."""
_lock = threading.Lock()
_installed = False


def stop_at_exit(service: Service, stop: Callable[[], None] | None = None) -> None:
    """Have ``stop`` (default ``service.stop``) called at interpreter exit, on SIGTERM and on SIGHUP
    (where the main thread's handler is still the default) unless :func:`forget` is called first;
    the services started last are stopped first."""
    global _installed
    with _lock:
        _live[id(service)] = stop or service.stop
        if _installed:
            return
        _installed = True
    atexit.register(_stop_all)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _stop_all_and_die)


def forget(service: Service) -> None:
    """``service`` stopped: nothing to do for it at exit."""
    with _lock:
        _live.pop(id(service), None)


def _stop_all() -> None:
    with _lock:
        stops = list(_live.values())
    for stop in reversed(stops):
        with contextlib.suppress(Exception):
            stop()


def _stop_all_and_die(signum: int, frame: FrameType | None) -> None:
    # Stop the services, then die of the same signal: an exception raised here could be
    # swallowed by whatever is running (a test runner records it as a test failure).
    _stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
