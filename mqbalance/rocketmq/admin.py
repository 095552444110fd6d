"""A broker's offset requests, as RocketMQ's admin tools send them: a queue's min and max offset, the
offset of a time, a group's committed offset, and writing it; and releasing a client's queue locks
(asyncio, one connection a request).

The requests are RocketMQ's own (``org.apache.rocketmq.remoting.protocol.RequestCode``), their
fields those of its request headers, 4.x and 5.x alike: ``mqadmin`` reads and writes offsets with
them (``queryConsumerOffset``, ``updateConsumerOffset`` in ``cloneGroupOffset`` and the offline reset
of ``resetOffsetByTime``). Each answer's ``offset`` field is read strictly: a broker that answers
anything else fails with :class:`AdminError`, never with what the parser met.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from mqbalance.rocketmq.nameserver import DEFAULT_TIMEOUT, invoke
from mqbalance.rocketmq.remoting import (
    Credentials,
    FrameError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    request,
    sign,
)

MAX_OFFSET = 2**63 - 1
"""A queue offset is a Java long."""

_opaque = itertools.count(1)


class AdminError(Exception):
    """A broker did not answer an offset request, refused it, or answered what is not an offset."""


@dataclass(frozen=True)
class BrokerQueue:
    """A queue as RocketMQ names it in a request body: topic, broker name, queue id."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass(frozen=True)
class QueueRef:
    """A queue where a broker serves it: the master's address and the queue of the topic."""

    address: str
    topic: str
    queue_id: int


class BrokerAdmin:
    """Offset requests to brokers, signed with ``credentials`` when the brokers check ACL."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, credentials: Credentials | None = None) -> None:
        self.timeout = timeout
        self.credentials = credentials

    async def min_offset(self, queue: QueueRef) -> int:
        """The queue's first offset still stored (older messages are gone)."""
        return await self._offset(RequestCode.GET_MIN_OFFSET, queue, {})

    async def max_offset(self, queue: QueueRef) -> int:
        """The offset the queue's next message will have."""
        return await self._offset(RequestCode.GET_MAX_OFFSET, queue, {})

    async def search_offset(self, queue: QueueRef, timestamp_ms: int) -> int:
        """The offset of the queue's first message stored at or after ``timestamp_ms`` (epoch ms);
        the max offset when none is (RocketMQ's ``searchOffset``)."""
        return await self._offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, queue, {"timestamp": timestamp_ms})

    async def committed_offset(self, group: str, queue: QueueRef) -> int | None:
        """The group's committed offset of the queue; None when it has committed none."""
        fields = {"consumerGroup": group}
        response = await self._ask(RequestCode.QUERY_CONSUMER_OFFSET, queue, fields)
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        return self._read_offset(RequestCode.QUERY_CONSUMER_OFFSET, queue, response)

    async def commit_offset(self, group: str, queue: QueueRef, offset: int) -> None:
        """Write the group's committed offset of the queue (as a consumer commits it, but awaited)."""
        if not 0 <= offset <= MAX_OFFSET:
            raise ValueError(f"offset {offset} is not a queue offset")
        fields = {"consumerGroup": group, "commitOffset": offset}
        response = await self._ask(RequestCode.UPDATE_CONSUMER_OFFSET, queue, fields)
        if response.code != ResponseCode.SUCCESS:
            code = RequestCode.UPDATE_CONSUMER_OFFSET
            raise self._refused(code, queue.address, _queue_name(queue), response)

    async def unlock(self, address: str, group: str, client_id: str, queues: Sequence[BrokerQueue]) -> None:
        """Release the broker locks ``client_id`` holds on ``queues`` (of the broker at ``address``)
        for ``group``: ``UNLOCK_BATCH_MQ``, which an orderly consumer sends for itself when it
        lets go of a queue; the broker drops only locks held by that client."""
        command = batch_request(RequestCode.UNLOCK_BATCH_MQ, next(_opaque), group, client_id, queues)
        response = await self._send(RequestCode.UNLOCK_BATCH_MQ, address, command)
        if response.code != ResponseCode.SUCCESS:
            raise self._refused(RequestCode.UNLOCK_BATCH_MQ, address, f"group {group}", response)

    async def _offset(self, code: RequestCode, queue: QueueRef, fields: Mapping[str, object]) -> int:
        response = await self._ask(code, queue, fields)
        if response.code != ResponseCode.SUCCESS:
            raise self._refused(code, queue.address, _queue_name(queue), response)
        return self._read_offset(code, queue, response)

    async def _ask(self, code: RequestCode, queue: QueueRef, fields: Mapping[str, object]) -> RemotingCommand:
        command = request(code, next(_opaque), {"topic": queue.topic, "queueId": queue.queue_id, **fields})
        return await self._send(code, queue.address, command)

    async def _send(self, code: RequestCode, address: str, command: RemotingCommand) -> RemotingCommand:
        if self.credentials is not None:
            command = sign(command, self.credentials)
        try:
            return await invoke(address, command, self.timeout)
        except TimeoutError:
            raise AdminError(
                f"broker {address}: no answer to {code.name} within {self.timeout:g} s"
            ) from None
        except (OSError, FrameError) as exc:
            raise AdminError(f"broker {address}: {code.name} failed: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _read_offset(code: RequestCode, queue: QueueRef, response: RemotingCommand) -> int:
        text = response.ext_fields.get("offset", "")
        if not (text.isascii() and text.lstrip("-").isdigit() and len(text) <= 20):
            raise AdminError(f"broker {queue.address} answered {code.name} without an offset: {text[:40]!r}")
        offset = int(text)
        if not -1 <= offset <= MAX_OFFSET:
            raise AdminError(f"broker {queue.address} answered {code.name} with offset {offset}")
        return offset

    @staticmethod
    def _refused(code: RequestCode, address: str, subject: str, response: RemotingCommand) -> AdminError:
        remark = (response.remark or "")[:300]
        return AdminError(
            f"broker {address} refused {code.name} of {subject}: "
            f"code {response.code}: {remark or '(no remark)'}"
        )


def _queue_name(queue: QueueRef) -> str:
    return f"{queue.topic}:{queue.queue_id}"


def batch_request(
    code: RequestCode, opaque: int, group: str, client_id: str, queues: Sequence[BrokerQueue]
) -> RemotingCommand:
    """A LOCK_BATCH_MQ or UNLOCK_BATCH_MQ request: both bodies name the group, the client and the
    queues (LockBatchRequestBody, UnlockBatchRequestBody)."""
    body = {
        "consumerGroup": group,
        "clientId": client_id,
        "onlyThisBroker": False,
        "mqSet": [{"topic": q.topic, "brokerName": q.broker_name, "queueId": q.queue_id} for q in queues],
    }
    return replace(request(code, opaque), body=json.dumps(body).encode())
