"""A NameServer on 127.0.0.1 that answers each topic's route request with one fault of its own: what a
broken, hostile or overloaded NameServer can send the operator (the hostile-tenant suite,
tests/integration/reliability/test_reliability_hostile.py).

The topic name selects the answer (:data:`ANSWERS`): garbage bytes, nesting deeper than any parser's
stack, a billion queues, a frame announced larger than RocketMQ allows, one cut short, silence. Every
request is answered on its own connection, as :mod:`mqbalance.rocketmq.nameserver` asks, in a thread
per connection so that a silent answer holds up nothing else.
"""

from __future__ import annotations

import json
import socketserver
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from harness.processes.net import serving_in_thread
from mqbalance.rocketmq.remoting import (
    FLAG_RESPONSE,
    RemotingCommand,
    ResponseCode,
    decode_payload,
    encode,
    frame_length,
)

Answer = Callable[[RemotingCommand], bytes | None]
"""The bytes sent back for a request (None: none at all, the connection held open)."""


def _route(queues_per_broker: int | float | str, brokers: int = 2) -> bytes:
    names = [f"broker-{i}" for i in range(brokers)]
    document = {
        "queueDatas": [
            {"brokerName": n, "readQueueNums": queues_per_broker, "writeQueueNums": 4, "perm": 6}
            for n in names
        ],
        "brokerDatas": [
            {"brokerName": n, "cluster": "c", "brokerAddrs": {"0": f"127.0.0.1:{10911 + i}"}}
            for i, n in enumerate(names)
        ],
    }
    return json.dumps(document).replace('"1e400"', "1e400").encode()


def _success(body: bytes) -> Answer:
    def answer(request: RemotingCommand) -> bytes:
        response = RemotingCommand(
            code=ResponseCode.SUCCESS, opaque=request.opaque, flag=FLAG_RESPONSE, body=body
        )
        return encode(response)

    return answer


def _raw(data: bytes) -> Answer:
    return lambda request: data


def _error_code(request: RemotingCommand) -> bytes:
    remark = "x" * 65_536  # a long remark: kept to a line in a condition
    response = RemotingCommand(
        code=ResponseCode.SYSTEM_ERROR, opaque=request.opaque, flag=FLAG_RESPONSE, remark=remark
    )
    return encode(response)


def _wrong_opaque(request: RemotingCommand) -> bytes:
    """Responses to some other request, forever: a client must give up at its timeout."""
    return encode(replace(_ok(request), opaque=request.opaque + 1))


def _ok(request: RemotingCommand) -> RemotingCommand:
    return RemotingCommand(
        code=ResponseCode.SUCCESS, opaque=request.opaque, flag=FLAG_RESPONSE, body=_route(4)
    )


ANSWERS: dict[str, Answer] = {
    "valid": lambda request: encode(_ok(request)),
    "not-utf8": _success(b'{"queueDatas": "\xff\xfe\x80\x81"}'),
    "deep-list": _success(b"[" * 200_000),
    "deep-object": _success(b'{"a":' * 100_000),
    "billion-queues": _success(_route(1_000_000_000)),
    "many-brokers": _success(_route(1024, brokers=2_000)),
    "overflowing-number": _success(_route("1e400")),
    "wrong-types": _success(b'{"queueDatas": 7, "brokerDatas": "x"}'),
    "oversized-frame": _raw(struct.pack(">i", 0x7FFFFFFF) + b"\0" * 64),
    "cut-short": _raw(struct.pack(">i", 1000) + b"\0" * 10),
    "header-past-frame": _raw(struct.pack(">iI", 8, 0x00FFFFFF) + b"\0" * 4),
    "error-code": _error_code,
    "wrong-opaque": _wrong_opaque,
    "silence": lambda request: None,
}
"""Topic name -> the answer to its route request. Every name but ``valid`` is a fault."""
FAULTS = tuple(name for name in ANSWERS if name != "valid")


class _Handler(socketserver.BaseRequestHandler):
    server: HostileNameServer

    def handle(self) -> None:
        self.request.settimeout(10)
        try:
            length = frame_length(self._read(4))
            request = decode_payload(self._read(length))
        except (OSError, ValueError):
            return
        topic = request.ext_fields.get("topic", "")
        self.server.asked(topic)
        answer = ANSWERS.get(topic, ANSWERS["valid"])(request)
        if answer is None:  # silence: hold the connection until the client gives up
            self.request.settimeout(None)
            while self.request.recv(4096):
                pass
            return
        try:
            self.request.sendall(answer)
            if topic == "wrong-opaque":  # the same foreign answer again, then silence
                for _ in range(1000):
                    self.request.sendall(answer)
                while self.request.recv(4096):
                    pass
        except OSError:
            return

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.request.recv(n - len(data))
            if not chunk:
                raise ConnectionResetError("closed")
            data += chunk
        return data


class HostileNameServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        """Topic -> route requests received."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def asked(self, topic: str) -> None:
        with self._lock:
            self.requests[topic] = self.requests.get(topic, 0) + 1


@contextmanager
def hostile_nameserver() -> Iterator[HostileNameServer]:
    """A :class:`HostileNameServer` answering in a thread for the block."""
    with serving_in_thread(HostileNameServer(), "hostile-nameserver") as server:
        yield server
