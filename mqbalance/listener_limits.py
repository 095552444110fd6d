"""What each HTTP listener allows its clients, and the options that set it (standard library only, so that
a component's configuration reads them without importing aiohttp; ``mqbalance.listener`` enforces them)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one listener allows its clients (docs/reliability.md, "Listeners"). A connection holding the
    largest unfinished head it may send (31 header lines of 8 KB) costs about 0.5 MiB, an idle one about
    5 KB. The defaults are the operator's and the injector's; the sidecar's metrics listener takes 16
    connections and its API, reached by the pod's own application only, 512 (mqbalance/sidecar/config.py)."""

    max_connections: int = 64
    idle_timeout: float = 75.0
    """Seconds a connection may wait between requests (longer than Prometheus's default 30 s scrape
    interval and nginx's 75 s keep-alive, so pooled connections are reused)."""
    read_timeout: float = 10.0
    """Seconds for a request's head and body from its first byte (and for a TLS handshake)."""
    max_headers: int = 32

    def __post_init__(self) -> None:
        if not 1 <= self.max_connections <= 100_000:
            raise ValueError(f"--max-connections must be from 1 to 100000, got {self.max_connections}")
        for flag, seconds in (("--idle-timeout", self.idle_timeout), ("--read-timeout", self.read_timeout)):
            if not 0 < seconds <= 3600:
                raise ValueError(f"{flag} must be above 0 and at most 3600 seconds, got {seconds:g}")
        if not 1 <= self.max_headers <= 1024:
            raise ValueError(f"max_headers must be from 1 to 1024, got {self.max_headers}")


DEFAULTS = Limits()


def add_arguments(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str] | None = None,
    defaults: Limits = DEFAULTS,
    listeners: str = "each listener",
) -> None:
    """``--max-connections``, ``--idle-timeout``, ``--read-timeout``; with ``env``, defaults from
    ``MQBALANCE_MAX_CONNECTIONS``, ``MQBALANCE_IDLE_TIMEOUT`` and ``MQBALANCE_READ_TIMEOUT``."""

    def default(name: str, value: float) -> str:
        return (env or {}).get(f"MQBALANCE_{name}") or f"{value:g}"

    where = " (env MQBALANCE_{})" if env is not None else ""
    parser.add_argument(
        "--max-connections",
        default=default("MAX_CONNECTIONS", defaults.max_connections),
        metavar="N",
        help=f"open connections {listeners} keeps at most; a new one closes the one idle longest "
        f"(default {defaults.max_connections}){where.format('MAX_CONNECTIONS')}",
    )
    parser.add_argument(
        "--idle-timeout",
        default=default("IDLE_TIMEOUT", defaults.idle_timeout),
        metavar="SECONDS",
        help=f"close a connection idle this long between requests "
        f"(default {defaults.idle_timeout:g}){where.format('IDLE_TIMEOUT')}",
    )
    parser.add_argument(
        "--read-timeout",
        default=default("READ_TIMEOUT", defaults.read_timeout),
        metavar="SECONDS",
        help=f"a request's head and body must arrive within this many seconds of its first byte "
        f"(default {defaults.read_timeout:g}){where.format('READ_TIMEOUT')}",
    )


def limits_from(args: argparse.Namespace) -> Limits:
    """The :class:`Limits` of :func:`add_arguments`'s options; ValueError naming the option."""
    values: dict[str, float] = {}
    for name, kind in (("max_connections", int), ("idle_timeout", float), ("read_timeout", float)):
        text = str(getattr(args, name))
        try:
            values[name] = kind(text)
        except ValueError:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be a number, got {text!r}") from None
    return Limits(int(values["max_connections"]), values["idle_timeout"], values["read_timeout"])


def parse_hosts(text: str, option: str = "--host") -> tuple[str, ...]:
    """The addresses of a comma-separated list (``$(POD_IP),127.0.0.1``); ValueError when it names none."""
    hosts = tuple(part.strip() for part in text.split(","))
    if not hosts or not all(hosts):
        raise ValueError(f"{option} must list addresses separated by commas, got {text!r}")
    return hosts
