"""Response frames of a real NameServer written to files: the fixtures of the remoting codec's unit
tests (``python -m harness.rocketmq capture DIR``)."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

from harness.rocketmq.releases import RocketMQError
from harness.rocketmq.server import RocketMQ
from mqbalance.model import PERM_READ
from mqbalance.rocketmq.remoting import RemotingCommand, RequestCode, encode, frame_length, request


def raw_exchange(address: str, command: RemotingCommand, timeout: float = 5.0) -> bytes:
    """Send one request and return the response frame exactly as the server wrote it."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode(command))
        data = b""
        while len(data) < 4 or len(data) < 4 + frame_length(data[:4]):
            chunk = sock.recv(65536)
            if not chunk:
                raise RocketMQError(f"{address} closed the connection after {len(data)} bytes")
            data += chunk
    return data


def capture(version: str, out: Path) -> None:
    """Write response frames of a real NameServer of ``version`` to files in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with RocketMQ(version, brokers=("broker-a", "broker-b")) as mq:
        mq.create_topic("orders", read_queues=8, write_queues=4, brokers=["broker-a"])
        mq.create_topic("orders", 2, perm=PERM_READ, brokers=["broker-b"])
        exchanges = {
            "route-orders": request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1, {"topic": "orders"}),
            # A client older than 4.9.4 gets fastjson's bare integer keys.
            "route-orders-old-client": replace(
                request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 2, {"topic": "orders"}), version=0
            ),
            "route-missing": request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 3, {"topic": "missing"}),
            "cluster-info": request(RequestCode.GET_BROKER_CLUSTER_INFO, 4),
        }
        for name, command in exchanges.items():
            path = out / f"{version}-{name}.bin"
            path.write_bytes(raw_exchange(mq.namesrv_addr, command))
            print(path)
        (out / f"{version}-ports.json").write_text(
            json.dumps({"namesrv": mq.namesrv_port, **mq.broker_ports}, sort_keys=True) + "\n"
        )
