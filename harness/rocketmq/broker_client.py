"""A blocking connection to a RocketMQ broker with the calls the harness's own consumers and
producers make: the consumer apps of the real-pod tests (harness/apps/consumer_app.py,
harness/apps/lag_consumer_app.py) and the nemesis suite's producer (harness.faults.nemesis_mq).

The consumer apps run in the project's image, which holds mqbalance but not the harness: this module
imports the standard library and mqbalance's remoting codec only, and
:func:`harness.apps.pods.pod_app_command` hands it to the app's interpreter together with the app's
source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from typing import Any

from mqbalance.rocketmq.remoting import decode_payload, encode, frame_length, request

SEND_MESSAGE, PULL_MESSAGE, QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET = 10, 11, 14, 15
SUCCESS, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED, QUERY_NOT_FOUND = 0, 19, 20, 21, 22
FLAG_SUBSCRIPTION = 0x4
"""PullSysFlag: the subscription comes with the request (no heartbeat registration needed)."""


class BrokerError(RuntimeError):
    """A broker unreachable or answering with an error."""


class OffsetMoved(BrokerError):
    """A pull from an offset the queue no longer has (PULL_OFFSET_MOVED): where to go on from."""

    def __init__(self, queue_id: int, offset: int, fields: dict[str, str]) -> None:
        super().__init__(f"offset {offset} of queue {queue_id} moved: {fields}")
        self.next_offset = int(fields.get("nextBeginOffset", offset))
        self.fields = fields


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``; ConnectionError when the broker closes the connection first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


class Broker:
    """One blocking connection to a broker for ``group`` and ``topic``, one request at a time; opened
    at the first call and again after any error (a broker restart)."""

    def __init__(self, address: str, group: str = "", topic: str = "", timeout: float = 2.0) -> None:
        self.address = address
        self.group = group
        self.topic = topic
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._opaque = 0

    def call(self, code: int, fields: dict[str, object], body: bytes = b"") -> Any:
        """The broker's answer to one request; BrokerError (the connection closed) when none came."""
        try:
            if self._sock is None:
                host, _, port = self.address.rpartition(":")
                self._sock = socket.create_connection((host, int(port)), timeout=self.timeout)
            self._opaque += 1
            command = dataclasses.replace(request(code, self._opaque, fields), body=body)
            self._sock.sendall(encode(command))
            # The broker's own requests to a registered client (NOTIFY_CONSUMER_IDS_CHANGED) are skipped.
            while True:
                answer = decode_payload(read_exactly(self._sock, frame_length(read_exactly(self._sock, 4))))
                if answer.is_response and answer.opaque == self._opaque:
                    return answer
        except (OSError, ValueError) as exc:
            self.close()
            raise BrokerError(f"{self.address}: {exc}") from None

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None

    def committed(self, queue_id: int) -> int:
        """The group's committed offset of the queue (0 when it has none yet)."""
        fields = {"consumerGroup": self.group, "topic": self.topic, "queueId": queue_id}
        answer = self.call(QUERY_CONSUMER_OFFSET, fields)
        if answer.code == QUERY_NOT_FOUND:
            return 0
        if answer.code != SUCCESS:
            raise BrokerError(f"QUERY_CONSUMER_OFFSET: {answer.code} {answer.remark}")
        return int(answer.ext_fields["offset"])

    def commit(self, queue_id: int, offset: int) -> None:
        fields = {
            "consumerGroup": self.group,
            "topic": self.topic,
            "queueId": queue_id,
            "commitOffset": offset,
        }
        answer = self.call(UPDATE_CONSUMER_OFFSET, fields)
        if answer.code != SUCCESS:
            raise BrokerError(f"UPDATE_CONSUMER_OFFSET: {answer.code} {answer.remark}")

    def pull(self, queue_id: int, offset: int, batch: int) -> tuple[bytes, int]:
        """At most ``batch`` messages from ``offset`` on, in the store's format, and the next offset;
        no bytes and ``offset`` when none is there yet. OffsetMoved when the offset is gone."""
        fields = {
            "consumerGroup": self.group, "topic": self.topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": batch, "sysFlag": FLAG_SUBSCRIPTION, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0, "expressionType": "TAG",
        }  # fmt: skip
        answer = self.call(PULL_MESSAGE, fields)
        if answer.code in (PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY):
            return b"", offset
        if answer.code == PULL_OFFSET_MOVED:
            raise OffsetMoved(queue_id, offset, dict(answer.ext_fields))
        if answer.code != SUCCESS:
            raise BrokerError(f"PULL_MESSAGE: {answer.code} {answer.remark}")
        return answer.body or b"", int(answer.ext_fields["nextBeginOffset"])
