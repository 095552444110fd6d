"""A real RocketMQ on loopback: one NameServer and one or more Brokers from Apache's own jars.

The jars of each release are fetched once (:mod:`harness.rocketmq.releases`). Every start gets free
ports, small heaps, 16 MiB commit-log files and a temporary store that is removed on stop. Logs of
every process are kept in the work directory and shown when something fails.

5.x NameServers and Brokers bind 127.0.0.1 (``bindAddress``); the Broker's HA port (used
only by slaves) binds the wildcard address, as RocketMQ has no setting for it, and 4.9.x binds
the wildcard address everywhere. Nothing here ever connects anywhere but 127.0.0.1, or the
``broker_host`` a test put on the loopback interface.

Command line::

    python -m harness.rocketmq up [--version V] [--brokers N] [--topic NAME:QUEUES ...]
    python -m harness.rocketmq fetch [--version V]        # fetch or reuse the jars
    python -m harness.rocketmq capture [--version V] DIR  # the codec's fixtures
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Self, TypeVar

from harness import polling
from harness.paths import tmpfs_root
from harness.processes.command import run_command, serve_until_interrupted, stop_on_ctrl_c
from harness.processes.managed import Component
from harness.processes.net import free_port_block
from harness.processes.service import Service
from harness.processes.workdir import WorkDir
from harness.rocketmq.acl import AUTH_CREATE_ACL, AUTH_CREATE_USER, Acl, acl_broker_settings, plain_acl_yml
from harness.rocketmq.releases import (
    DEFAULT_VERSION,
    MqadminError,
    RocketMQError,
    ensure_jars,
    is_5x,
    lib_dir,
)
from mqbalance.model import PERM_READ_WRITE
from mqbalance.rocketmq.nameserver import NameServerClient, NameServerError, invoke
from mqbalance.rocketmq.remoting import RemotingCommand, RequestCode, ResponseCode, request, sign
from mqbalance.rocketmq.route import ClusterInfo, TopicRouteData

CLUSTER = "mqbalance"

# RocketMQ reaches into NIO internals (direct buffer cleaning, mmap); JDK 17 needs them opened.
_ADD_OPENS = (
    "java.base/java.nio",
    "java.base/sun.nio.ch",
    "java.base/java.lang",
    "java.base/java.util",
    "java.base/java.lang.reflect",
)
_JVM_COMMON = (
    *(f"--add-opens={m}=ALL-UNNAMED" for m in _ADD_OPENS),
    # 4.x frees mapped files with jdk.internal.ref.Cleaner (a restart after a SIGKILL drops index files).
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
    "-XX:+UseSerialGC",  # small heaps, two cores: no parallel collector threads
    "-XX:TieredStopAtLevel=1",  # C1 only: starts faster, plenty for a test broker
    "-Xss512k",
    # 5.x creates self-signed certificates for "permissive" TLS at start (about 10 s on a busy
    # machine); nothing here uses TLS.
    "-Dtls.server.mode=disabled",
    "-Drocketmq.client.logUseSlf4j=false",
)

_LOGBACK = """<?xml version="1.0" encoding="UTF-8"?>
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${rmq.log.file}</file>
    <append>true</append>
    <encoder><pattern>%d{HH:mm:ss.SSS} %p %t %c{0} - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


T = TypeVar("T")

_QUERY_CONSUMER_OFFSET = 14
_GET_ALL_TOPIC_CONFIG = 21
_GET_BROKER_RUNTIME_INFO = 28
_QUERY_NOT_FOUND = 22
"""RequestCode and ResponseCode values the master-slave helpers use."""


class _PortTaken(Exception):
    """A server lost the race for a port picked free (other test runs start servers too)."""

    def __init__(self, proc: Component) -> None:
        super().__init__(proc.name)
        self.proc = proc


class RocketMQ(Service):
    """NameServer + Brokers of one RocketMQ release on 127.0.0.1.

    Use as a context manager. ``brokers`` names the broker groups (one master each); ``zones``
    gives some of them the zone they register with (5.x only: ``$ROCKETMQ_ZONE``).
    ``broker_host``: the address the brokers register with and (5.x) bind, 127.0.0.1 unless a test
    put another on the loopback interface; ``jvm_options``: more ``-D`` options for every JVM.
    """

    def __init__(
        self,
        version: str = DEFAULT_VERSION,
        *,
        brokers: Sequence[str] = ("broker-a",),
        workdir: str | os.PathLike[str] | None = None,
        namesrv_heap_mb: int = 96,
        broker_heap_mb: int = 256,
        ready_timeout: float = 120.0,
        broker_config: dict[str, str] | None = None,
        zones: Mapping[str, str] | None = None,
        acl: Acl | None = None,
        slaves: Sequence[str] = (),
        broker_host: str = "127.0.0.1",
        jvm_options: Sequence[str] = (),
    ) -> None:
        if not brokers:
            raise ValueError("at least one broker name is needed")
        self.version = version
        self.broker_names = tuple(brokers)
        self._workdir = WorkDir(workdir, "RocketMQ", RocketMQError)
        self.namesrv_heap_mb = namesrv_heap_mb
        self.broker_heap_mb = broker_heap_mb
        self.ready_timeout = ready_timeout
        self.broker_config = dict(broker_config or {})
        self.broker_host = broker_host
        self.jvm_options = tuple(jvm_options)
        self.zones = dict(zones or {})
        self.acl = acl
        self.slave_names = tuple(slaves)
        if set(self.slave_names) - set(self.broker_names):
            raise ValueError(f"slaves {self.slave_names} name brokers not in {self.broker_names}")
        self.namesrv_port = 0
        self.broker_ports: dict[str, int] = {}
        self._namesrv: Component | None = None
        self._brokers: dict[str, Component] = {}
        self.slave_ports: dict[str, int] = {}
        self._slaves: dict[str, Component] = {}
        self._stopped_masters: dict[str, Component] = {}
        self._lock = threading.RLock()
        self.started_in = 0.0

    # -- properties --------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        return self._workdir.path

    @property
    def namesrv_addr(self) -> str:
        """``127.0.0.1:PORT``, what clients call ``namesrvAddr``."""
        if not self.namesrv_port:
            raise RocketMQError("RocketMQ not started")
        return f"127.0.0.1:{self.namesrv_port}"

    def broker_addr(self, name: str) -> str:
        return f"{self.broker_host}:{self.broker_ports[name]}"

    @property
    def is_5x(self) -> bool:
        return is_5x(self.version)

    @property
    def pids(self) -> dict[str, int]:
        procs = {"namesrv": self._namesrv, **{f"broker {n}": p for n, p in self._brokers.items()}}
        return {name: p.proc.pid for name, p in procs.items() if p is not None and p.proc is not None}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        with self._lock:
            if self._namesrv is not None:
                return self
            started = time.monotonic()
            lib = ensure_jars(self.version)
            try:
                self._prepare(lib)
                self._with_fresh_ports(self._start_namesrv)
                for name in self.broker_names:
                    self._start_broker(name)
                self._with_fresh_ports(self._wait_registered)
                self._grant_client()
                for name in self.slave_names:
                    self._start_slave(name)
            except BaseException:
                self.stop()
                raise
            self.started_in = time.monotonic() - started
            return self

    def stop(self, grace: float = 0.0) -> None:
        """Stop every process (SIGKILL by default: the store is thrown away, and a broker's
        graceful shutdown takes up to 20 s)."""
        with self._lock:
            for proc in [*self._slaves.values(), *self._brokers.values(), self._namesrv]:
                if proc is not None:
                    proc.stop(grace)
            self._brokers = {}
            self._slaves = {}
            self._namesrv = None
            self._workdir.remove()

    def restart_broker(self, name: str, grace: float = 30.0) -> None:
        """Stop a broker gracefully (SIGTERM; killed after ``grace`` seconds, stretched for load) and
        start it again on the same ports and store; returns once the NameServer lists it again."""
        proc = self._brokers[name]
        proc.stop(polling.scaled(grace))
        proc.start()
        self._wait_registered()

    def kill_broker(self, name: str) -> None:
        """SIGKILL one broker (its queues become unreachable; the NameServer drops it later)."""
        proc = self._brokers.pop(name)
        proc.stop(0)

    # -- master-slave pairs (``slaves``) ----------------------------------------------------

    def slave_addr(self, name: str) -> str:
        return f"127.0.0.1:{self.slave_ports[name]}"

    def _start_slave(self, name: str) -> None:
        """Start ``name``'s slave (brokerId 1) and wait until the NameServer lists it."""
        for attempt in range(3):
            self._start_broker(name, slave=True)
            try:
                self._wait_for(
                    f"slave of {name} to register", lambda: self._slave_registered(name), self._slaves[name]
                )
                return
            except _PortTaken:
                self._slaves.pop(name).stop(0)
                if attempt == 2:
                    raise RocketMQError(f"slave of {name}: ports taken 3 times:\n{self.logs()}") from None

    def _slave_registered(self, name: str) -> bool | None:
        info = self._cluster_info_or_none()
        broker = info.brokers.get(name) if info is not None else None
        return True if broker is not None and broker.addresses.get(1) == self.slave_addr(name) else None

    def _create_on_slaves(self, names: Sequence[str], fields: Mapping[str, object]) -> None:
        # A slave refuses pulls and offset requests for a topic it does not know. A 5.x slave
        # copies its master's topics only every 60 s (SlaveSynchronize.syncAll) and accepts the
        # topic itself; a 4.x slave refuses it but copies them every 10 s: wait for that.
        topic = str(fields["topic"])
        for name in (n for n in names if n in self._slaves):
            address = self.slave_addr(name)
            if not self.is_5x:
                copied = partial(self._knows, address, topic)
                self._wait_for(f"slave of {name} to copy topic {topic!r}", copied)
                continue
            command = self._as_admin(request(RequestCode.UPDATE_AND_CREATE_TOPIC, 1, fields))
            response = self.invoke(address, command)
            if response.code != ResponseCode.SUCCESS:
                raise RocketMQError(f"slave of {name} refused topic {topic!r}: {response.remark}")

    def _knows(self, address: str, topic: str) -> bool | None:
        response = self.invoke(address, self._as_admin(request(_GET_ALL_TOPIC_CONFIG, 1)))
        if response.code != ResponseCode.SUCCESS:
            return None
        return True if topic in json.loads(response.body).get("topicConfigTable", {}) else None

    def commit_log_max_offset(self, address: str) -> int:
        """The broker's commit log end (``GET_BROKER_RUNTIME_INFO``'s ``commitLogMaxOffset``)."""
        response = self.invoke(address, self._as_admin(request(_GET_BROKER_RUNTIME_INFO, 1)))
        if response.code != ResponseCode.SUCCESS:
            raise RocketMQError(f"runtime info of {address}: code {response.code}: {response.remark}")
        return int(json.loads(response.body)["table"]["commitLogMaxOffset"])

    def consumer_offset(self, address: str, group: str, topic: str, queue_id: int) -> int:
        """The consumed offset the broker at ``address`` stores for ``group`` (-1: none), asked
        with ``QUERY_CONSUMER_OFFSET`` as a client's ``RemoteBrokerOffsetStore`` asks it."""
        fields = {"consumerGroup": group, "topic": topic, "queueId": queue_id}
        response = self.invoke(address, self._as_admin(request(_QUERY_CONSUMER_OFFSET, 1, fields)))
        if response.code == _QUERY_NOT_FOUND:
            return -1
        if response.code != ResponseCode.SUCCESS:
            raise RocketMQError(f"offset of {group} on {address}: code {response.code}: {response.remark}")
        return int(response.ext_fields["offset"])

    def stop_master(self, name: str) -> None:
        """SIGKILL ``name``'s master once its slave holds every message it stored; returns when the
        NameServer no longer lists the master (at once: the broker's connection closes)."""
        master, slave = self.broker_addr(name), self.slave_addr(name)
        self._wait_for(
            f"slave of {name} to replicate its master",
            lambda: self.commit_log_max_offset(slave) >= self.commit_log_max_offset(master) or None,
        )
        proc = self._brokers.pop(name)
        proc.stop(0)
        self._stopped_masters[name] = proc

        def gone() -> bool | None:
            info = self._cluster_info_or_none()
            broker = info.brokers.get(name) if info is not None else None
            return True if broker is not None and broker.master_address is None else None

        self._wait_for(f"the NameServer to drop the master of {name}", gone)

    def start_master(self, name: str) -> None:
        """Start the master :meth:`stop_master` stopped, on its ports and store; returns once the
        NameServer lists it again."""
        proc = self._stopped_masters.pop(name)
        self._brokers[name] = proc
        proc.start()

        def back() -> bool | None:
            info = self._cluster_info_or_none()
            broker = info.brokers.get(name) if info is not None else None
            return True if broker is not None and broker.master_address == self.broker_addr(name) else None

        self._wait_for(f"the master of {name} to register again", back)

    # -- helpers for callers -----------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        queues: int = 4,
        *,
        read_queues: int | None = None,
        write_queues: int | None = None,
        perm: int = PERM_READ_WRITE,
        brokers: Sequence[str] | None = None,
        order: bool = False,
    ) -> TopicRouteData:
        """Create (or update) ``topic`` on ``brokers`` (default: all), wait for the NameServer
        to serve the new route, and return that route."""
        read = queues if read_queues is None else read_queues
        write = queues if write_queues is None else write_queues
        names = tuple(brokers or self.broker_names)
        fields = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": read,
            "writeQueueNums": write,
            "perm": perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": order,
        }
        for name in names:
            command = self._as_admin(request(RequestCode.UPDATE_AND_CREATE_TOPIC, 1, fields))
            response = self._run(invoke(self.broker_addr(name), command))
            if response.code != ResponseCode.SUCCESS:
                refusal = f"code {response.code}: {response.remark}"
                raise RocketMQError(f"broker {name} refused topic {topic!r}: {refusal}\n{self.logs()}")
        self._create_on_slaves(names, fields)

        def served() -> TopicRouteData | None:
            try:
                route = self.route(topic)
            except NameServerError:
                return None
            got = {q.broker_name: (q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas}
            return route if all(got.get(n) == (read, write, perm) for n in names) else None

        return self._wait_for(f"route of {topic!r} on the NameServer", served)

    def create_group(self, group: str) -> None:
        """Create consumer group ``group`` on every broker (``mqadmin updateSubGroup``), as a consumer's
        first heartbeat would: brokers that do not create groups on their own refuse its offsets before."""
        self.mqadmin("updateSubGroup", "-c", CLUSTER, "-g", group)

    def create_static_topic(self, topic: str, queues: int) -> TopicRouteData:
        """Create (or grow) 5.x static topic ``topic``: ``queues`` logical queues spread over the
        cluster's brokers, with RocketMQ's own ``mqadmin updateStaticTopic``; returns the route once
        the NameServer serves its queue mappings."""
        self.mqadmin("updateStaticTopic", "-t", topic, "-qn", str(queues), "-c", CLUSTER)

        def served() -> TopicRouteData | None:
            try:
                route = self.route(topic)
            except NameServerError:
                return None
            totals = {m.total_queues for m in route.queue_mappings}
            return route if totals == {queues} else None

        return self._wait_for(f"static route of {topic!r} on the NameServer", served)

    def route(self, topic: str) -> TopicRouteData:
        return self._run(NameServerClient(self.namesrv_addr).topic_route(topic))

    def cluster_info(self) -> ClusterInfo:
        return self._run(NameServerClient(self.namesrv_addr).cluster_info())

    def invoke(self, address: str, command: RemotingCommand) -> RemotingCommand:
        return self._run(invoke(address, command))

    def mqadmin(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """RocketMQ's own admin tool of this release, against this NameServer (``-n`` added)."""
        argv = [
            *self._java(128, "tools"),
            "org.apache.rocketmq.tools.command.MQAdminStartup",
            args[0],
            "-n",
            self.namesrv_addr,
            *args[1:],
        ]
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=polling.scaled(timeout),
            env=self._env(),
            check=False,
        )
        # A command that failed (a refusal, a timeout on a loaded machine) is reported on stderr
        # as a SubCommandException, and mqadmin still exits 0.
        if result.returncode != 0 or "SubCommandException" in result.stderr:
            raise MqadminError(
                f"mqadmin {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )
        return result

    def send(self, topic: str, count: int) -> None:
        """``count`` messages to ``topic`` acknowledged by a broker, sent with RocketMQ's own producer
        (``mqadmin checkMsgSendRT``). That command prints a failed send as ``false`` and exits 0, so
        the sends that failed are made again until ``count`` were acknowledged."""
        left = count

        def acknowledged() -> bool:
            nonlocal left
            out = self.mqadmin("checkMsgSendRT", "-t", topic, "-a", str(left), "-s", "32").stdout
            # Rows: broker name, queue id, send result, RT (a failed send has no broker name).
            left -= sum(1 for line in out.splitlines() if line.split()[2:3] == ["true"])
            return left <= 0

        self._wait_for(f"{count} sends to {topic!r} acknowledged", acknowledged, retry_on=(MqadminError,))

    def stored(self, topic: str) -> int:
        """Messages the brokers hold for ``topic``: the sum of its queues' max offsets (``mqadmin
        topicStatus``). Under load a producer stores a retried send twice and a failed one not at all,
        so a test that counts lag compares against this, not against the number it sent."""

        def maxima() -> list[int]:
            out = self.mqadmin("topicStatus", "-t", topic).stdout
            rows = [line.split() for line in out.splitlines()]
            return [int(f[3]) for f in rows if len(f) >= 4 and f[1].isdigit() and f[3].isdigit()]

        listed = self._wait_for(
            f"topicStatus to list the queues of {topic!r}", maxima, retry_on=(MqadminError,)
        )
        return sum(listed)

    def logs(self, lines: int = 30) -> str:
        parts = []
        procs = [
            ("namesrv", self._namesrv),
            *self._brokers.items(),
            *((f"{n} slave", p) for n, p in self._slaves.items()),
        ]
        for name, proc in procs:
            if proc is None:
                continue
            parts.append(f"--- {name} console ({proc.log}) ---\n{proc.tail(lines)}")
            server_log = proc.log.with_suffix(".log")
            if server_log.is_file():
                tail = "\n".join(server_log.read_text(errors="replace").splitlines()[-lines:])
                parts.append(f"--- {name} log ({server_log}) ---\n{tail}")
        return "\n".join(parts)

    @property
    def classpath(self) -> str:
        """Our logging configuration first, then the release's jars."""
        return f"{self.workdir / 'conf'}{os.pathsep}{lib_dir(self.version) / '*'}"

    # -- internals ---------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(coro)

    def _as_admin(self, command: RemotingCommand) -> RemotingCommand:
        return command if self.acl is None else sign(command, self.acl.admin)

    def _grant_client(self) -> None:
        """5.x ACL 2.0: make the client user and its ACL on every broker (4.x reads them from
        plain_acl.yml). Each broker keeps its own users, as each master of a cluster does."""
        if self.acl is None or not self.is_5x:
            return
        client = self.acl.client
        user = {"username": client.access_key, "password": client.secret_key, "userType": "Normal"}
        entries = [
            {"resource": f"{kind}:*", "actions": ["Pub", "Sub", "Get"], "decision": "Allow"}
            for kind in ("Topic", "Group")
        ]
        subject = f"User:{client.access_key}"
        policy = {"subject": subject, "policies": [{"policyType": "Custom", "entries": entries}]}
        for name in self.broker_names:
            for code, fields, body in (
                (AUTH_CREATE_USER, {"username": client.access_key}, user),
                (AUTH_CREATE_ACL, {"subject": subject}, policy),
            ):
                command = replace(request(code, 1, fields), body=json.dumps(body).encode())
                response = self.invoke(self.broker_addr(name), self._as_admin(command))
                if response.code != ResponseCode.SUCCESS:
                    raise RocketMQError(
                        f"broker {name} refused ACL request {code}: code {response.code}: {response.remark}"
                    )

    def _prepare(self, lib: Path) -> None:
        self._workdir.make(lambda: Path(tempfile.mkdtemp(prefix="mqbalance-rocketmq-", dir=tmpfs_root())))
        conf = self.workdir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        # 5.x looks up rmq.logback.xml on the classpath first; 4.x reads conf/logback_*.xml
        # under ROCKETMQ_HOME. Either way everything goes to the file named by rmq.log.file.
        (conf / "rmq.logback.xml").write_text(_LOGBACK)
        for name in ("logback_namesrv.xml", "logback_broker.xml", "logback_tools.xml"):
            (conf / name).write_text(_LOGBACK)
        if self.acl is not None:
            # 4.x brokers read plain_acl.yml under ROCKETMQ_HOME; mqadmin of both lines signs
            # with the account in conf/tools.yml.
            if not self.is_5x:
                (conf / "plain_acl.yml").write_text(plain_acl_yml(self.acl))
            admin = self.acl.admin
            (conf / "tools.yml").write_text(f"accessKey: {admin.access_key}\nsecretKey: {admin.secret_key}\n")
        (self.workdir / "logs").mkdir(exist_ok=True)

    def _env(self) -> dict[str, str]:
        # ROCKETMQ_HOME only locates conf/; user.home (set below) keeps ~/logs and ~/store
        # defaults inside the work directory.
        return {**os.environ, "ROCKETMQ_HOME": str(self.workdir)}

    def _java(self, heap_mb: int, log_name: str) -> list[str]:
        return [
            "java",
            *self.jvm_options,
            f"-Xms{min(64, heap_mb)}m",
            f"-Xmx{heap_mb}m",
            f"-XX:MaxDirectMemorySize={heap_mb}m",
            *_JVM_COMMON,
            f"-Duser.home={self.workdir}",
            f"-Djava.io.tmpdir={self.workdir}",  # mqadmin updateStaticTopic writes its mapping files there
            f"-Drmq.log.file={self.workdir / 'logs' / (log_name + '.log')}",
            "-cp",
            self.classpath,
        ]

    def _start_namesrv(self) -> None:
        self.namesrv_port = free_port_block((0,))
        conf = self.workdir / "namesrv.conf"
        lines = [f"listenPort={self.namesrv_port}"]
        if self.is_5x:
            lines.append("bindAddress=127.0.0.1")
        conf.write_text("\n".join(lines) + "\n")
        argv = [
            *self._java(self.namesrv_heap_mb, "namesrv"),
            "org.apache.rocketmq.namesrv.NamesrvStartup",
            "-c",
            str(conf),
        ]
        self._namesrv = Component("namesrv", argv, self.workdir / "logs" / "namesrv.out", self._env())
        self._namesrv.start()
        self._wait_for("NameServer", self._cluster_info_or_none, self._namesrv)

    def _start_broker(self, name: str, slave: bool = False) -> None:
        port = free_port_block((-2, 0, 1))  # fast remoting port, remoting port, HA port
        (self.slave_ports if slave else self.broker_ports)[name] = port
        label = f"{name}-slave" if slave else name
        store = self.workdir / "store" / label
        settings = {
            "brokerClusterName": CLUSTER,
            "brokerName": name,
            "brokerId": "1" if slave else "0",
            "namesrvAddr": self.namesrv_addr,
            "listenPort": str(port),
            "haListenPort": str(port + 1),
            "brokerIP1": self.broker_host,
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
            "mappedFileSizeCommitLog": str(16 * 1024 * 1024),
            "mappedFileSizeConsumeQueue": str(20 * 6000),  # 6,000 entries of 20 bytes
            "flushDiskType": "ASYNC_FLUSH",
            "autoCreateTopicEnable": "false",
            "autoCreateSubscriptionGroup": "true",
            "deleteWhen": "04",
            "diskMaxUsedSpaceRatio": "95",
            # A test broker shares two cores with everything else a run starts; RocketMQ's production
            # defaults shed load as "broker busy" once a send waited 200 ms for its thread or the page
            # cache lock was held 1 s, and a test's producer fails on what is only a busy machine.
            "waitTimeMillsInSendQueue": "10000",
            "osPageCacheBusyTimeOutMills": "10000",
            **({"bindAddress": self.broker_host, "timerWheelEnable": "false"} if self.is_5x else {}),
            **(acl_broker_settings(self.acl, self.is_5x) if self.acl is not None else {}),
            **self.broker_config,
            # A slave learns its master's HA address from the NameServer's answer to its registration.
            **({"brokerRole": "SLAVE"} if slave else {}),
        }
        conf = self.workdir / f"broker-{label}.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        argv = [
            *self._java(self.broker_heap_mb, f"broker-{label}"),
            "org.apache.rocketmq.broker.BrokerStartup",
            "-c",
            str(conf),
        ]
        env = {**self._env(), **({"ROCKETMQ_ZONE": self.zones[name]} if name in self.zones else {})}
        proc = Component(f"broker {label}", argv, self.workdir / "logs" / f"broker-{label}.out", env)
        (self._slaves if slave else self._brokers)[name] = proc
        proc.start()

    def _with_fresh_ports(self, step: Callable[[], object], attempts: int = 3) -> None:
        """Run ``step``; a server that lost its port is started again on new ones."""
        for attempt in range(attempts):
            try:
                step()
                return
            except _PortTaken as taken:
                if attempt == attempts - 1:
                    raise RocketMQError(
                        f"{taken.proc.name}: ports taken {attempts} times:\n{self.logs()}"
                    ) from None
                taken.proc.stop(0)
                if taken.proc is self._namesrv:
                    continue  # _start_namesrv picks new ports
                name = next(n for n, p in self._brokers.items() if p is taken.proc)
                self._start_broker(name)

    def _cluster_info_or_none(self) -> ClusterInfo | None:
        try:
            return self.cluster_info()
        except NameServerError:
            return None

    def _wait_registered(self) -> None:
        def all_registered() -> ClusterInfo | None:
            info = self._cluster_info_or_none()
            if info is None:
                return None
            registered = all(
                (b := info.brokers.get(n)) is not None and b.master_address == self.broker_addr(n)
                for n in self.broker_names
            )
            return info if registered else None

        self._wait_for(f"brokers {', '.join(self.broker_names)} to register", all_registered)

    def _wait_for(
        self,
        what: str,
        probe: Callable[[], T | None],
        proc: Component | None = None,
        *,
        retry_on: tuple[type[Exception], ...] = (),
    ) -> T:
        """Until ``probe`` holds (its ``retry_on`` errors meaning "not yet"); a NameServer or broker
        that exits meanwhile ends the wait at once, with the logs."""

        def ready() -> T | None:
            for p in [self._namesrv, *self._brokers.values(), proc]:
                if p is not None and not p.running():
                    if "Address already in use" in p.tail(200):
                        raise _PortTaken(p)
                    raise RocketMQError(f"{p.name} exited while waiting for {what}:\n{self.logs()}")
            return probe()

        return polling.wait_for(
            what, ready, self.ready_timeout, 0.1, RocketMQError, retry_on=retry_on, details=self.logs
        )


def _cmd_up(args: argparse.Namespace) -> int:
    stop_on_ctrl_c()
    brokers = [f"broker-{chr(ord('a') + i)}" for i in range(args.brokers)]
    with RocketMQ(args.version, brokers=brokers, workdir=args.dir) as mq:
        print(
            f"# RocketMQ {args.version} ready in {mq.started_in:.1f} s; logs in {mq.workdir / 'logs'}",
            file=sys.stderr,
        )
        for spec in args.topic:
            topic, _, queues = spec.partition(":")
            mq.create_topic(topic, int(queues or 4))
            print(f"# topic {topic}: {queues or 4} queues on each broker", file=sys.stderr)
        return serve_until_interrupted(f"export NAMESRV_ADDR={mq.namesrv_addr}", lambda: True, mq.logs)


def _cmd_capture(args: argparse.Namespace) -> int:
    """Write response frames of a real NameServer to files, for the codec's unit tests."""
    from harness.rocketmq.capture import capture

    capture(args.version, args.out)
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    print(ensure_jars(args.version))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.rocketmq", description="A real local RocketMQ.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up", help="start NameServer + brokers, print `export NAMESRV_ADDR=...`, wait for Ctrl-C"
    )
    up.add_argument("--version", default=DEFAULT_VERSION)
    up.add_argument("--brokers", type=int, default=1)
    up.add_argument("--topic", action="append", default=[], metavar="NAME[:QUEUES]")
    up.add_argument("--dir", type=Path, default=None, help="keep configuration, store and logs here")
    up.set_defaults(func=_cmd_up)
    fetch = sub.add_parser("fetch", help="fetch or reuse the jars; print their directory")
    fetch.add_argument("--version", default=DEFAULT_VERSION)
    fetch.set_defaults(func=_cmd_fetch)
    capture = sub.add_parser("capture", help="write a real NameServer's response frames (codec fixtures)")
    capture.add_argument("--version", default=DEFAULT_VERSION)
    capture.add_argument("out", type=Path)
    capture.set_defaults(func=_cmd_capture)
    return run_command(parser, argv, RocketMQError)


if __name__ == "__main__":
    sys.exit(main())
