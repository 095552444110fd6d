"""Every process the harness runs, on one base: :class:`ManagedProcess`.

A child process logging to a file, started, checked, stopped with SIGTERM (then SIGKILL) or killed
outright. :class:`Component` is the long-running server the harness starts for a test (the
control plane's components, RocketMQ's and Spark's JVMs, kwok, Prometheus): its own process group,
which every signal reaches, and killed by the kernel with the thread that started it.
The product's processes are in :mod:`harness.apps` (``OperatorProcess``, ``SidecarProcess``), the
end-to-end run's clients in :mod:`harness.apps.e2e`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.paths import REPO
from harness.polling import scaled, wait_for


class ProcessExited(AssertionError):
    """A process stopped that should still run; the message holds the end of its log."""


def _die_with_parent() -> None:
    # Runs in the child before exec: if the Python process is killed outright (SIGKILL, CI
    # timeout) the kernel kills the component too, so nothing is left behind. SIGKILL, not
    # SIGTERM: with no owner left nobody waits for a graceful stop, and a current kube-apiserver
    # takes a minute over one. Linux ties this to the thread that started the child, which is
    # why start() is documented as belonging to a long-lived thread.
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


class ManagedProcess:
    """A child process logging to a file: stopped with SIGTERM (then SIGKILL), or killed outright.

    ``env`` None inherits this process's environment. ``group``: the child leads its own process
    group (a terminal's Ctrl-C does not reach it) and every signal goes to the whole group, so
    nothing it started lingers. ``with_parent_death``: the kernel SIGKILLs it when the thread that
    started it dies, even by SIGKILL (Linux). ``stdin``: ``subprocess.PIPE`` to write to it.
    """

    tail_lines = 40
    scale_grace = True
    """Whether a stop's grace is stretched for the machine's load (``harness.polling.scaled``)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None,
        log: Path,
        error: type[Exception] = ProcessExited,
        *,
        group: bool = False,
        with_parent_death: bool = False,
        stdin: int = subprocess.DEVNULL,
        cwd: Path | None = REPO,
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env) if env is not None else None
        self.log = log
        self.error = error
        self.group = group
        preexec = _die_with_parent if with_parent_death and sys.platform == "linux" else None
        self._options: dict[str, Any] = {
            "stdin": stdin,
            "cwd": cwd,
            "start_new_session": group,
            "preexec_fn": preexec,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0
        self.started_at = 0.0
        """``time.perf_counter()`` when the process was spawned."""

    def spawn(self) -> None:
        """Start the process without waiting for anything."""
        self.started_at = time.perf_counter()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, **self._options
            )

    def start(self) -> None:
        self.spawn()

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"the {self.name} is not running"
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def alive(self) -> bool:
        return self.running()

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def check(self) -> None:
        """Raise ``error`` with the end of the log if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self.error(f"the {self.name} exited with code {self.proc.returncode}:\n{self.tail()}")

    def _signal(self, proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds of grace (at once when 0); a group's
        stragglers are killed after its leader."""
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM if timeout > 0 else signal.SIGKILL)
            try:
                proc.wait((scaled(timeout) if self.scale_grace else timeout) if timeout > 0 else None)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait()
        if self.group:  # the leader is gone; make sure nothing else in its group lingers
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL, the way a node failure or the OOM killer ends a process."""
        if self.proc is None:
            return
        self._signal(self.proc, signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        self.kills += 1

    def tail(self, lines: int | None = None) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-(lines or self.tail_lines) :])


class Component(ManagedProcess):
    """A server the harness runs for a test (a control-plane component, a RocketMQ or Spark JVM,
    kwok, Prometheus): its own process group, killed with the thread that started it, its start
    written into its log. Its stop's grace is fixed per component (the API server's 2 s skips its
    watch drain), not stretched for load."""

    tail_lines = 25
    scale_grace = False

    def __init__(self, name: str, argv: list[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        super().__init__(name, argv, env, log, group=True, with_parent_death=True, cwd=None)

    def spawn(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"\n=== starting {self.name}: {' '.join(self.argv)}\n".encode())
        super().spawn()

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)

    def wait_ready(
        self,
        what: str,
        probe: Callable[[], bool],
        timeout: float,
        error: type[Exception],
        details: Callable[[], str],
    ) -> None:
        """Until ``probe`` holds (``timeout`` scaled for load), polled every 0.1 s; ``error`` at once
        when the component exits meanwhile, with ``details()`` (the logs) either way."""

        def ready() -> bool:
            if not self.running():
                raise error(f"{self.name} exited while waiting for {what}:\n{details()}")
            return probe()

        wait_for(what, ready, timeout, 0.1, error, retry_on=(OSError, ValueError), details=details)
