"""A Spark standalone cluster on loopback for the tests: one master and one-core workers.

Started from the pip-installed pyspark, which ships Spark's jars and ``bin/spark-class`` (not the
``sbin/start-*.sh`` daemon scripts): the master and each worker are ``spark-class`` processes, each
in its own process group, logging to a file in ``workdir``. Everything is bound to 127.0.0.1:
``--host 127.0.0.1`` for the RPC endpoints and ``SPARK_LOCAL_IP=127.0.0.1`` for the web UIs, the
executors the workers launch and a driver run with :meth:`SparkCluster.driver_env`. Ports are free
ports of 127.0.0.1; :func:`sockets_of` lets a test check that nothing listens or connects elsewhere.

Stopping kills every process group (the workers' executors and their Python workers are in their
worker's group), also at interpreter exit; if the Python process is killed outright the kernel
kills the master and the workers (``PR_SET_PDEATHSIG``) and the executors exit when their worker
goes. Only the standard library is imported here.

Command line (prints the master's URL, then waits for Ctrl-C)::

    python -m harness.spark.cluster [--dir DIR] [--workers 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from harness.polling import scaled, wait_for
from harness.processes.managed import Component
from harness.processes.net import free_port
from harness.processes.procfs import process_files
from harness.processes.service import Service, forget, stop_at_exit

LOOPBACK = "127.0.0.1"
APP_NAME = "mqbalance-replay"
"""The application name ``mqbalance replay`` gives its Spark session."""

JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""For every JVM of the cluster and its drivers: short runs on small data, so the quick JIT only and
one GC thread, which costs far less CPU on a busy machine than the JVM's defaults."""

FINISHED_TASK = re.compile(r"Executor: Finished task \S+ in stage \S+ \(TID \d+\)")
"""The line an executor logs for every task it finishes (its ``Executor`` logger at INFO: LOG4J2)."""

LOG4J2 = """\
# Spark's log settings for the test cluster and its drivers (SPARK_CONF_DIR is on their classpath).
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# The daemons' own lifecycle (registrations, executors launched), for a failure's report.
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
# Every task an executor runs and finishes: how a test tells which worker ran tasks. A logger of its
# own keeps its level when a driver lowers the root's (SparkContext.setLogLevel).
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = info
"""


def spark_home() -> Path:
    """The installed pyspark's directory: Spark's ``bin/`` and ``jars/`` are in it."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed (the 'replay' extra)")
    return Path(spec.origin).parent


class _Daemon(Component):
    """One ``spark-class`` process in its own process group."""

    tail_lines = 30

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        super().__init__(name, argv, log, env)

    @property
    def pgid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"the Spark {self.name} exited with code {self.proc.returncode}:\n{self.tail()}"
            )

    def stop(self, timeout: float = 10.0) -> None:
        # Executors and Python workers outlive a worker for a moment: the group is killed after.
        super().stop(timeout)


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""An opener that never goes through an HTTP proxy from the environment: the master is on loopback."""


@dataclass(frozen=True)
class Worker:
    index: int
    work_dir: Path
    """Where the worker puts each application's executors: ``APP_ID/EXECUTOR_ID/stderr``."""
    webui_port: int


@dataclass(frozen=True)
class DriverRun:
    returncode: int
    seconds: float
    app_id: str
    """The application the master registered for the driver ("" if it saw none or several)."""
    sockets: frozenset[Socket]
    """Every socket seen open, sampled every 0.2 s, by the cluster's processes and the driver's."""


class SparkCluster(Service):
    """A standalone master and ``workers`` workers of one core each on 127.0.0.1.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. A driver reaches it at
    :attr:`master_url` with the environment :meth:`driver_env`.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        workers: int = 2,
        worker_memory: str = "1g",
        executor_memory: str = "512m",
    ) -> None:
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="mqbalance-spark-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = spark_home()
        self.worker_count = workers
        self.worker_memory = worker_memory
        self.executor_memory = executor_memory
        self.port = 0
        self.webui_port = 0
        self.workers: list[Worker] = []
        self._daemons: list[_Daemon] = []
        self.conf_dir = self.workdir / "conf"

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{LOOPBACK}:{self.webui_port}"

    def _write_conf(self) -> None:
        # Read by spark-submit (a driver run with driver_env) and by the daemons: SPARK_CONF_DIR.
        self.conf_dir.mkdir(exist_ok=True)
        cores = self.worker_count  # one core per worker
        defaults = {
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.ui.enabled": "false",  # the driver's UI: not needed, one listener fewer
            "spark.master.rest.enabled": "false",  # the master's submission server (fixed port 6066)
            "spark.driver.extraJavaOptions": JAVA_OPTS,
            "spark.executor.extraJavaOptions": JAVA_OPTS,
            "spark.executor.memory": self.executor_memory,
            "spark.cores.max": str(cores),
            # The driver submits its first job only once every worker's executor has registered, so
            # a small job spreads over all of them instead of the first one to come up.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{int(scaled(120))}s",
            "spark.local.dir": str(self.workdir / "local"),
            "spark.sql.shuffle.partitions": str(4 * cores),
        }
        text = "".join(f"{key} {value}\n" for key, value in defaults.items())
        (self.conf_dir / "spark-defaults.conf").write_text(text, encoding="utf-8")
        (self.conf_dir / "log4j2.properties").write_text(LOG4J2, encoding="utf-8")

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(self.home),
            SPARK_CONF_DIR=str(self.conf_dir),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_LOCAL_DIRS=str(self.workdir / "local"),
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS=JAVA_OPTS,
            SPARK_NO_DAEMONIZE="1",
            PYSPARK_PYTHON=sys.executable,
        )
        env.pop("SPARK_MASTER_HOST", None)
        return env

    def driver_env(self) -> dict[str, str]:
        """The environment of a driver (``mqbalance replay --master``) using this cluster."""
        return self._env()

    def _daemon(self, name: str, cls: str, *args: str) -> _Daemon:
        argv = [str(self.home / "bin" / "spark-class"), cls, *args]
        daemon = _Daemon(name, argv, self._env(), self.workdir / f"{name}.log")
        self._daemons.append(daemon)
        daemon.start()
        return daemon

    def start(self, timeout: float = 120.0) -> Self:
        """Start the master, then the workers; return once the master counts every worker alive."""
        stop_at_exit(self, lambda: self.stop(grace=2.0))
        (self.workdir / "local").mkdir(exist_ok=True)
        self._write_conf()
        self.port, self.webui_port = free_port(), free_port()
        try:
            master = self._daemon(
                "master",
                "org.apache.spark.deploy.master.Master",
                *("--host", LOOPBACK, "--port", str(self.port), "--webui-port", str(self.webui_port)),
            )

            def master_up() -> dict[str, Any] | None:
                master.check()
                return self._state_or_none()

            wait_for(f"the Spark master's UI at {self.webui_url}", master_up, timeout, interval=0.2)
            for index in range(self.worker_count):
                worker = Worker(index, self.workdir / f"worker-{index}", free_port())
                worker.work_dir.mkdir(exist_ok=True)
                self.workers.append(worker)
                self._daemon(
                    f"worker-{index}",
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", LOOPBACK, "--cores", "1", "--memory", self.worker_memory),
                    *("--webui-port", str(worker.webui_port), "--work-dir", str(worker.work_dir)),
                    self.master_url,
                )

            def all_alive() -> bool:
                for daemon in self._daemons:
                    daemon.check()
                state = self._state_or_none()
                return state is not None and int(state.get("aliveworkers", 0)) >= self.worker_count

            wait_for(f"{self.worker_count} Spark workers registered with the master", all_alive, timeout, 0.2)
        except BaseException:
            self.stop(grace=2.0)
            raise
        return self

    def _state_or_none(self) -> dict[str, Any] | None:
        try:
            return self.state()
        except (OSError, ValueError):
            return None

    def state(self) -> dict[str, Any]:
        """The master's JSON view (``/json/``): workers, active and completed applications."""
        with _DIRECT.open(f"{self.webui_url}/json/", timeout=scaled(5)) as response:
            state: dict[str, Any] = json.loads(response.read())
        return state

    def pgids(self) -> list[int]:
        return [d.pgid for d in self._daemons if d.pgid is not None]

    def finished_tasks(self, app_id: str) -> dict[int, int]:
        """Tasks each worker's executors finished for ``app_id`` (worker index -> count), from the
        executors' logs in the workers' work dirs."""
        counts: dict[int, int] = {}
        for worker in self.workers:
            counts[worker.index] = sum(
                len(FINISHED_TASK.findall(log.read_text(errors="replace")))
                for log in (worker.work_dir / app_id).glob("*/stderr")
            )
        return counts

    def run_driver(self, argv: list[str], log: Path, timeout: float = 300.0) -> DriverRun:
        """Run a driver (``mqbalance replay --master``, :attr:`master_url`) in its own process group
        until it exits, watching the sockets of every process of the cluster and of the driver
        meanwhile; the application it ran is the one the master newly lists as completed."""
        before = {app["id"] for app in self.state().get("completedapps", [])}
        seen: set[Socket] = set()
        started = time.perf_counter()
        driver = Component("driver", argv, log, self.driver_env())
        driver.start()
        proc = driver.proc
        assert proc is not None
        try:

            def exited() -> bool:
                seen.update(sockets_of(processes_in_groups([*self.pgids(), proc.pid])))
                return proc.poll() is not None

            wait_for(f"the driver {' '.join(argv[:4])}... to exit", exited, timeout, interval=0.2)
        finally:
            driver.stop(0)  # what is left of its group with it
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            return DriverRun(proc.returncode, seconds, "", frozenset(seen))

        def listed() -> list[str] | None:
            apps = self.state().get("completedapps", [])
            return [app["id"] for app in apps if app["id"] not in before] or None

        # The master marks the application completed when the driver disconnects: at its exit.
        apps = wait_for("the master to list the driver's application as completed", listed, 60)
        return DriverRun(proc.returncode, seconds, apps[0] if len(apps) == 1 else "", frozenset(seen))

    def stop(self, grace: float = 10.0) -> None:
        for daemon in reversed(self._daemons):
            daemon.stop(grace)
        self._daemons.clear()
        self.workers.clear()
        forget(self)

    def logs(self, lines: int = 30) -> str:
        return "\n".join(f"--- {d.name} ({d.log})\n{d.tail(lines)}" for d in self._daemons)


# --- who listens and connects where ---------------------------------------------------------


@dataclass(frozen=True)
class Socket:
    pid: int
    proto: str
    """``tcp``, ``tcp6``, ``udp`` or ``udp6``."""
    state: str
    """``LISTEN``, ``ESTABLISHED``, ... (TCP); ``UDP`` for UDP sockets."""
    local: str
    remote: str

    @property
    def loopback_only(self) -> bool:
        return all(_is_loopback(addr) for addr in (self.local, self.remote) if not _unspecified(addr))


_TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


def _decode(hex_addr: str, v6: bool) -> str:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # /proc/net prints each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, raw)
    return f"[{ip}]:{int(port, 16)}" if v6 else f"{ip}:{int(port, 16)}"


def _host(addr: str) -> str:
    return addr.rpartition(":")[0].strip("[]")


def _is_loopback(addr: str) -> bool:
    host = _host(addr)
    return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or host.startswith("::ffff:127.")


def _unspecified(addr: str) -> bool:
    # A connected or listening socket never has an unspecified remote; only the remote of a
    # listening socket (and of an unconnected UDP socket) is all zeros, port 0.
    host, port = _host(addr), addr.rpartition(":")[2]
    return host in ("0.0.0.0", "::") and port == "0"


def processes_in_groups(pgids: Iterable[int]) -> list[int]:
    """Every live process whose process group is one of ``pgids``."""
    wanted = set(pgids)
    found = []
    for pid, stat in process_files("stat"):
        fields = stat.rpartition(b")")[2].split()
        if len(fields) > 2 and int(fields[2]) in wanted:
            found.append(pid)
    return found


def _socket_inodes(pid: int) -> Iterator[str]:
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                yield target[len("socket:[") : -1]


def sockets_of(pids: Iterable[int]) -> list[Socket]:
    """The TCP and UDP sockets (IPv4 and IPv6) the processes ``pids`` hold open."""
    owner: dict[str, int] = {}
    for pid in pids:
        for inode in _socket_inodes(pid):
            owner[inode] = pid
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            inode = fields[9]
            if inode in owner:
                v6 = proto.endswith("6")
                state = _TCP_STATES.get(fields[3], fields[3]) if proto.startswith("tcp") else "UDP"
                found.append(
                    Socket(owner[inode], proto, state, _decode(fields[1], v6), _decode(fields[2], v6))
                )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.spark.cluster", description=__doc__)
    parser.add_argument("--dir", help="work directory (default: a new temporary one)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    with SparkCluster(args.dir, workers=args.workers) as cluster:
        print(f"master {cluster.master_url}, UI {cluster.webui_url}, logs in {cluster.workdir}", flush=True)
        print("drivers need: " + " ".join(f"{k}={cluster.driver_env()[k]}" for k in _DRIVER_KEYS), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


_DRIVER_KEYS = ("SPARK_LOCAL_IP", "SPARK_CONF_DIR")


if __name__ == "__main__":
    sys.exit(main())
