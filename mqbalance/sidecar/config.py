"""Sidecar settings, from command-line options with the pod's environment as defaults.

The environment names match what a pod spec sets through the downward API
(``POD_NAME``, ``POD_NAMESPACE``) plus ``MQBALANCE_*`` for the rest, so the Helm
chart can configure the sidecar without composing an argument list.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from mqbalance.listener_limits import Limits, add_arguments, limits_from, parse_hosts
from mqbalance.producer import Generation


class ConfigError(ValueError):
    """Settings that cannot work; the message names the option and how to fix it."""


class FaultTable(enum.StrEnum):
    """Which RocketMQ client generation's fault table (and selection) the producer side follows."""

    V4 = "4x"
    V5 = "5x"

    @property
    def generation(self) -> Generation:
        return Generation.V4 if self is FaultTable.V4 else Generation.V5


DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8081
DEFAULT_METRICS_PORT = 9091
DEFAULT_METRICS_HOST = "0.0.0.0"
"""Every address: a pod spec without MQBALANCE_METRICS_HOST still answers the kubelet's probes, which
call the pod's IP. The chart, the injector and the examples bind the pod's IP and loopback instead."""
API_LIMITS = Limits(max_connections=512)
"""The API's: its client is the pod's own application, whose HTTP client holds a connection for each request
it has in flight at once (a Java producer sending from many threads), about 5 KB each while idle."""
METRICS_MAX_CONNECTIONS = 16
"""The metrics listener's cap: Prometheus keeps a connection or two, the probes open one at a time, and the
connections of any other client go first (docs/reliability.md, "Listeners")."""
DEFAULT_MAX_WAIT = 300.0
"""Longest long-poll a client may ask for, in seconds."""


@dataclass(frozen=True)
class SidecarConfig:
    pod_name: str
    """This pod's name: the consumer id the operator assigns queues to."""
    namespace: str
    groups: tuple[str, ...]
    """ConsumerGroup resource names whose assignments this sidecar serves; the first is the default."""
    host: str = DEFAULT_HOST
    """The API's address, or several separated by commas."""
    port: int = DEFAULT_PORT
    metrics_host: str = DEFAULT_METRICS_HOST
    """The metrics' address, or several separated by commas: the pod spec gives ``$(POD_IP),127.0.0.1``."""
    metrics_port: int = DEFAULT_METRICS_PORT
    assignment_files: Mapping[str, Path] = field(default_factory=dict)
    """Group -> a mounted ConfigMap file read instead of watching the API."""
    kubeconfig: Path | None = None
    """None: the in-cluster service account, else KUBECONFIG or ~/.kube/config."""
    watch_topics: bool = True
    """Watch Topic resources for producer routes (needs list/watch on topics)."""
    fault_table: FaultTable = FaultTable.V5
    fault_tolerance: bool = False
    """Default of the select endpoint's ``faultTolerance`` (RocketMQ's sendLatencyFaultEnable)."""
    zone: str = ""
    """This pod's zone, for the machine-room selector."""
    max_wait: float = DEFAULT_MAX_WAIT
    file_poll_interval: float = 2.0
    pod_uid: str = ""
    """This pod's uid (downward API ``metadata.uid``): its member Lease's owner; "" for none."""
    limits: Limits = API_LIMITS
    """The API listener's; the metrics listener's are the same but for its cap."""
    metrics_max_connections: int = METRICS_MAX_CONNECTIONS

    @property
    def default_group(self) -> str:
        return self.groups[0]

    @property
    def metrics_limits(self) -> Limits:
        return replace(self.limits, max_connections=self.metrics_max_connections)

    @property
    def uses_api(self) -> bool:
        """Whether any input comes from the Kubernetes API (a watched group or topics)."""
        return self.watch_topics or any(g not in self.assignment_files for g in self.groups)


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mqbalance sidecar",
        description="Serve this pod's queue assignment and the producer queue selection over HTTP.",
    )
    p.add_argument("--pod-name", default=env.get("POD_NAME", ""), help="this pod's name (env POD_NAME)")
    p.add_argument(
        "--namespace", default=env.get("POD_NAMESPACE", ""), help="the pod's namespace (env POD_NAMESPACE)"
    )
    p.add_argument(
        "--pod-uid",
        default=env.get("POD_UID", ""),
        help="the pod's uid, owner of its member Lease (env POD_UID, from metadata.uid)",
    )
    p.add_argument(
        "--group",
        action="append",
        default=None,
        help="ConsumerGroup resource name; repeat or comma-separate for several (env MQBALANCE_GROUP)",
    )
    p.add_argument(
        "--host",
        default=env.get("MQBALANCE_SIDECAR_HOST", DEFAULT_HOST),
        help="API listen address (several separated by commas)",
    )
    p.add_argument("--port", default=env.get("MQBALANCE_SIDECAR_PORT", str(DEFAULT_PORT)), help="API port")
    p.add_argument(
        "--metrics-host",
        default=env.get("MQBALANCE_METRICS_HOST", DEFAULT_METRICS_HOST),
        help="metrics listen address, several separated by commas (env MQBALANCE_METRICS_HOST; "
        "the pod spec gives $(POD_IP),127.0.0.1)",
    )
    p.add_argument(
        "--metrics-port",
        default=env.get("MQBALANCE_METRICS_PORT", str(DEFAULT_METRICS_PORT)),
        help="metrics port (0 disables the metrics listener)",
    )
    p.add_argument(
        "--assignment-file",
        action="append",
        default=None,
        metavar="[GROUP=]PATH",
        help="read the assignment from a mounted ConfigMap file instead of the API; "
        "GROUP= is needed only with several groups (env MQBALANCE_ASSIGNMENT_FILE)",
    )
    p.add_argument(
        "--kubeconfig", default=env.get("KUBECONFIG") or None, help="kubeconfig file (env KUBECONFIG)"
    )
    p.add_argument(
        "--no-topics",
        action="store_true",
        default=_env_flag(env, "MQBALANCE_NO_TOPICS"),
        help="do not watch Topic resources (producer routes stay empty)",
    )
    p.add_argument(
        "--fault-table",
        default=env.get("MQBALANCE_FAULT_TABLE", FaultTable.V5.value),
        help="latency fault table: 4x or 5x (env MQBALANCE_FAULT_TABLE)",
    )
    p.add_argument(
        "--fault-tolerance",
        action=argparse.BooleanOptionalAction,
        default=_env_flag(env, "MQBALANCE_FAULT_TOLERANCE"),
        help="select with latency fault tolerance unless a request says otherwise",
    )
    p.add_argument(
        "--zone", default=env.get("MQBALANCE_ZONE", ""), help="this pod's zone (env MQBALANCE_ZONE)"
    )
    p.add_argument(
        "--max-wait",
        default=env.get("MQBALANCE_MAX_WAIT", str(DEFAULT_MAX_WAIT)),
        help="longest long-poll timeout a client may ask for, seconds",
    )
    add_arguments(p, env, API_LIMITS, "the API listener")
    p.add_argument(
        "--metrics-max-connections",
        default=env.get("MQBALANCE_METRICS_MAX_CONNECTIONS", str(METRICS_MAX_CONNECTIONS)),
        metavar="N",
        help=f"the same for the metrics listener (default {METRICS_MAX_CONNECTIONS}; "
        "env MQBALANCE_METRICS_MAX_CONNECTIONS)",
    )
    return p


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _port(value: str, option: str, *, allow_zero: bool = False) -> int:
    try:
        port = int(value)
    except ValueError:
        raise ConfigError(f"{option} must be a port number, got {value!r}") from None
    if not (0 if allow_zero else 1) <= port <= 65535:
        raise ConfigError(f"{option} must be between {0 if allow_zero else 1} and 65535, got {port}")
    return port


def _split(values: Sequence[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def env_groups(env: Mapping[str, str]) -> list[str]:
    """The groups ``MQBALANCE_GROUP`` names (comma-separated), as the sidecar reads them."""
    return _split([env.get("MQBALANCE_GROUP", "")])


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> SidecarConfig:
    """Settings from ``argv`` (options win) and ``env``; raises :class:`ConfigError`."""
    args = _parser(env).parse_args(list(argv))
    if not args.pod_name:
        raise ConfigError("the pod name is unknown: set POD_NAME from the downward API or pass --pod-name")
    if not args.namespace:
        raise ConfigError(
            "the namespace is unknown: set POD_NAMESPACE from the downward API or pass --namespace"
        )
    groups = _split(args.group) if args.group is not None else env_groups(env)
    if not groups:
        raise ConfigError(
            "no consumer group: set MQBALANCE_GROUP or pass --group NAME (a ConsumerGroup resource)"
        )
    if len(set(groups)) != len(groups):
        raise ConfigError(f"a group is named twice in {groups}")
    file_specs = args.assignment_file
    if file_specs is None:
        file_specs = _split([env.get("MQBALANCE_ASSIGNMENT_FILE", "")])
    files: dict[str, Path] = {}
    for spec in file_specs:
        group, sep, path = spec.rpartition("=")
        if not sep:
            if len(groups) > 1:
                raise ConfigError(
                    f"--assignment-file {spec!r}: several groups are configured, write it as GROUP=PATH"
                )
            group = groups[0]
        if group not in groups:
            raise ConfigError(f"--assignment-file {spec!r}: group {group!r} is not one of {groups}")
        files[group] = Path(path)
    try:
        fault_table = FaultTable(args.fault_table.replace(".", ""))
    except ValueError:
        raise ConfigError(f"--fault-table must be 4x or 5x, got {args.fault_table!r}") from None
    try:
        max_wait = float(args.max_wait)
    except ValueError:
        raise ConfigError(f"--max-wait must be a number of seconds, got {args.max_wait!r}") from None
    if not 0 < max_wait <= 3600:
        raise ConfigError(f"--max-wait must be within (0, 3600] seconds, got {max_wait}")
    try:
        limits = limits_from(args)
        parse_hosts(args.host, "--host")
        parse_hosts(args.metrics_host, "--metrics-host")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        metrics_max_connections = int(args.metrics_max_connections)
        replace(limits, max_connections=metrics_max_connections)
    except ValueError:
        raise ConfigError(
            f"--metrics-max-connections must be from 1 to 100000, got {args.metrics_max_connections!r}"
        ) from None
    return SidecarConfig(
        pod_name=args.pod_name,
        namespace=args.namespace,
        groups=tuple(groups),
        host=args.host,
        port=_port(args.port, "--port"),
        metrics_host=args.metrics_host,
        metrics_port=_port(args.metrics_port, "--metrics-port", allow_zero=True),
        assignment_files=files,
        kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
        watch_topics=not args.no_topics,
        fault_table=fault_table,
        fault_tolerance=bool(args.fault_tolerance),
        zone=args.zone,
        max_wait=max_wait,
        pod_uid=args.pod_uid,
        limits=limits,
        metrics_max_connections=metrics_max_connections,
    )
