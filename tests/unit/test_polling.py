"""harness.polling: deadlines derived from the work, stretched for the machine's load."""

from __future__ import annotations

import os
import time

import pytest

from harness import polling


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with nothing else to do and no scale set."""
    monkeypatch.delenv(polling.SCALE_ENV, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A clock each sleep moves on by a second."""
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(time, "sleep", lambda s: now.__setitem__(0, now[0] + 1))
    return now


def test_an_idle_machine_keeps_the_allowance(quiet: None) -> None:
    assert polling.timeout_scale() == 1.0
    assert polling.scaled(60) == 60


def test_load_above_the_cpus_stretches_every_deadline(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 1.0, 1.0))
    assert polling.load_factor() == 4.0
    monkeypatch.setattr(os, "getloadavg", lambda: (400.0, 1.0, 1.0))
    assert polling.load_factor() == polling.MAX_LOAD_FACTOR


def test_the_environment_multiplies_the_load_allowance(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(polling.SCALE_ENV, "2.5")
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 1.0, 1.0))
    assert polling.scaled(10) == 50
    assert polling.scaled(10, at_most=30) == 30


@pytest.mark.parametrize("text", ["fast", "0", "-1", "nan"])
def test_a_bad_scale_is_named(quiet: None, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(polling.SCALE_ENV, text)
    with pytest.raises(ValueError, match=polling.SCALE_ENV):
        polling.timeout_scale()


def test_work_timeout_grows_with_the_work() -> None:
    assert polling.work_timeout(60) == 60
    assert polling.work_timeout(60, 0.0005, 64 * 1024) == pytest.approx(92.768)


def test_wait_for_returns_as_soon_as_the_condition_holds(quiet: None) -> None:
    calls = iter([None, 0, "there"])
    assert polling.wait_for("it", lambda: next(calls), timeout=5, interval=0) == "there"


def test_wait_for_gives_up_after_the_scaled_allowance(
    quiet: None, clock: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 1.0, 1.0))  # x3
    with pytest.raises(AssertionError, match=r"timed out after 31\.0 s \(allowance 10 s, x3"):
        polling.wait_for("nothing", lambda: None, timeout=10)


def test_a_machine_that_gets_busier_extends_a_running_wait(
    quiet: None, clock: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Idle when the wait starts; from 5 s on the load is 4 on 2 CPUs (x2).
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 if clock[0] >= 5 else 0.0, 0.0, 0.0))
    assert polling.wait_for("late", lambda: clock[0] >= 15 or None, timeout=10) is True


def test_wait_for_names_the_last_error_it_retried_and_adds_the_details(
    quiet: None, clock: list[float]
) -> None:

    def refused() -> None:
        raise ConnectionRefusedError("nobody listens")

    with pytest.raises(TimeoutError, match=r"last: 'ConnectionRefusedError: nobody listens'\):\nthe log"):
        polling.wait_for("it", refused, 3, error=TimeoutError, retry_on=(OSError,), details=lambda: "the log")


def test_wait_for_ends_at_once_on_an_error_it_does_not_retry(quiet: None) -> None:
    def exited() -> None:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        polling.wait_for("it", exited, 3, retry_on=(OSError,))
