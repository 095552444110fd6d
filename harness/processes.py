"""Every process the harness runs, on one base: :class:`ManagedProcess`.

A child process logging to a file, started, checked, stopped with SIGTERM (then SIGKILL) or killed
outright. :class:`Component` is the long-running server the harness starts for a test (the
control plane's components, RocketMQ's and Spark's JVMs, kwok, Prometheus): its own process group,
which every signal reaches, and killed by the kernel with the thread that started it.
:class:`OperatorProcess` and :class:`SidecarProcess` are ``mqbalance operator`` and
``mqbalance sidecar`` as subprocesses against a cluster; ``harness.e2e.JavaProgram`` the end-to-end
run's Java clients. Also: :func:`process_files` reads a /proc file of every live process, and
:func:`serving_in_thread` runs an in-process server (a test's HTTP sink) for a block, and
:class:`WorkDir` is a service's working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from harness.polling import scaled, wait_for
from mqbalance.journal import JournalRecord
from mqbalance.sidecar.client import SidecarClient

if TYPE_CHECKING:
    from harness.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]

ErrorTypes = type[Exception] | tuple[type[Exception], ...]
_Server = TypeVar("_Server", bound=socketserver.BaseServer)


class ProcessExited(AssertionError):
    """A process stopped that should still run; the message holds the end of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_files(name: str) -> Iterator[tuple[int, bytes]]:
    """(pid, the content of ``/proc/<pid>/<name>``) of every live process; one that ends while it is
    read is passed over."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            content = (entry / name).read_bytes()
        except OSError:
            continue
        yield int(entry.name), content


@contextlib.contextmanager
def serving_in_thread(server: _Server, name: str) -> Iterator[_Server]:
    """``server`` answering requests in a daemon thread ``name`` for the block; shut down and closed
    afterwards."""
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


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


class WorkDir:
    """A service's working directory: the one its caller gave (kept), or a temporary one made at
    start and removed at stop."""

    def __init__(self, path: str | os.PathLike[str] | None, service: str, error: type[Exception]) -> None:
        self._path = Path(path) if path is not None else None
        self._owned = path is None
        self._service = service
        self._error = error

    @property
    def path(self) -> Path:
        if self._path is None:
            raise self._error(f"{self._service} not started")
        return self._path

    def make(self, temporary: Callable[[], Path]) -> Path:
        """The directory, created; ``temporary`` makes one when the caller gave none."""
        if self._path is None:
            self._path = temporary()
        self._path.mkdir(parents=True, exist_ok=True)
        return self._path

    def remove(self) -> None:
        """Remove a temporary directory; the caller's stays."""
        if self._owned and self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


class Service:
    """What the harness starts for a test and stops after it (a control plane, RocketMQ, Spark,
    kwok): ``with`` starts it and stops it."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None, errors: ErrorTypes) -> int:
    """A harness command line: the subcommand ``parser`` picks (``args.func``) run, the ``errors``
    it expects printed as ``error: ...`` with exit code 1."""
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def stop_on_ctrl_c() -> None:
    """An ``up`` command is stopped with Ctrl-C, even when started with SIGINT ignored (a
    background job of a non-interactive shell)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def serve_until_interrupted(
    export: str, running: Callable[[], bool], logs: Callable[[], str], hint: str = ""
) -> int:
    """An ``up`` command's last step: print ``export`` (for ``eval``), then run until Ctrl-C (0) or
    until ``running`` turns false (1, ``logs()`` printed)."""
    print(export, flush=True)
    print(f"# press Ctrl-C to stop{hint}", file=sys.stderr, flush=True)
    try:
        while running():
            time.sleep(1)
    except KeyboardInterrupt:
        print("\n# stopping", file=sys.stderr)
        return 0
    print(f"a component exited unexpectedly:\n{logs()}", file=sys.stderr)
    return 1


def mqbalance_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mqbalance", *args]


MUTANT_ENV = "MQBALANCE_TEST_MUTANT"
"""Names a deliberately broken operator of ``tests/mutation`` for :class:`OperatorProcess` to run
instead of the product (docs/reliability.md, "Mutation runs"); unset in every ordinary run."""


def operator_argv(*args: str) -> list[str]:
    """``mqbalance operator ARGS``; with ``$MQBALANCE_TEST_MUTANT`` set, the same operator with that
    mutant of ``tests/mutation/mutants.py`` applied first."""
    mutant = os.environ.get(MUTANT_ENV)
    if mutant:
        return [sys.executable, "-m", "tests.mutation.operator_mutant", mutant, "--", *args]
    return mqbalance_argv("operator", *args)


def cluster_env(cluster: LocalCluster, **extra: str) -> dict[str, str]:
    """The environment of a process run against ``cluster`` from outside it."""
    env = {**cluster.env, "PYTHONUNBUFFERED": "1", **extra}
    env.pop("KUBERNETES_SERVICE_HOST", None)  # never take the in-cluster path by accident
    return env


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


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def parse_metric(text: str, name: str, labels: Mapping[str, str]) -> float:
    """Sum of the samples of ``name`` in Prometheus text whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        got = {}
        for part in rest.rstrip("}").split('",'):
            if "=" in part:
                key, _, val = part.partition("=")
                got[key.strip()] = val.strip().strip('"')
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


class OperatorProcess(ManagedProcess):
    """``mqbalance operator`` serving ``namespaces``, its journal and log in ``workdir``."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespaces: list[str],
        workdir: Path,
        *extra: str,
        env: Mapping[str, str] | None = None,
        error: type[Exception] = ProcessExited,
    ) -> None:
        self.cluster = cluster
        self.namespaces = namespaces
        self.workdir = workdir
        self.extra = extra
        self.journal = workdir / "journal.jsonl"
        self.port = 0
        super().__init__("operator", [], env or cluster_env(cluster), workdir / "operator.log", error)

    def spawn(self) -> None:
        self.port = free_port()
        argv = ["--metrics-port", str(self.port), "--metrics-host", "127.0.0.1"]
        argv += ["--journal", str(self.journal), *self.extra]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        self.argv = operator_argv(*argv)
        super().spawn()

    def start(self, timeout: float = 60) -> None:
        self.spawn()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_for("the operator's /healthz", self.healthy, timeout, error=self.error)

    def healthy(self) -> bool:
        self.check()
        return _http_ok(f"http://127.0.0.1:{self.port}/healthz")

    def metrics_text(self, *names: str) -> str:
        """The operator's /metrics, or only the series ``names`` (``name[]``) when given."""
        query = "?" + urllib.parse.urlencode([("name[]", n) for n in names]) if names else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics{query}", timeout=5) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
        return parse_metric(self.metrics_text(name), name, labels)

    def reconciles(self) -> int:
        """Reconciles finished (any result); 0 before the operator answers."""
        try:
            return int(self.metric("mqbalance_reconciles_total"))
        except OSError:
            return 0

    def journal_records(self) -> list[JournalRecord]:
        if not self.journal.exists():
            return []
        text = self.journal.read_text()
        # A record still without its newline is the one a killed operator was writing;
        # the next start drops it (mqbalance.operator.journal).
        complete = text[: text.rfind("\n") + 1]
        return [JournalRecord.decode(line) for line in complete.splitlines() if line.strip()]


class SidecarProcess(ManagedProcess):
    """``mqbalance sidecar`` with ``args``, on free ports of 127.0.0.1."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        *args: str,
        metrics: bool = True,
        env: Mapping[str, str] | None = None,
        error: type[Exception] = ProcessExited,
    ) -> None:
        self.port = free_port()
        self.metrics_port = free_port() if metrics else 0
        argv = ["sidecar", "--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        if metrics:
            argv += ["--metrics-host", "127.0.0.1"]
        environment = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "MQBALANCE_LOG_LEVEL": "DEBUG",
            **(env or {}),
        }
        environment.pop("KUBERNETES_SERVICE_HOST", None)
        super().__init__("sidecar", mqbalance_argv(*argv, *args), environment, log, error)
        self.client = SidecarClient(f"http://127.0.0.1:{self.port}")

    def start(self, timeout: float = 60) -> None:
        self.spawn()
        wait_for(f"the sidecar to listen on port {self.port}", self.listening, timeout, error=self.error)

    def listening(self) -> bool:
        self.check()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2).close()
        except urllib.error.HTTPError:
            return True  # it answers: up
        except OSError:
            return False
        return True

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return parse_metric(r.read().decode(), name, labels)

    def long_poll(self, after: int, timeout: float = 30) -> int:
        """Block until the sidecar serves a generation other than ``after``; that generation."""
        return int(self.client.wait_for_change(after, timeout)["generation"])
