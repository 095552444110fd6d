"""mqbalance's broker requests (mqbalance.rocketmq.admin) against a real broker, on 4.9.7 and the
tested release: min and max offsets, the offset of a time, a group's committed offset written and
read back, each checked against RocketMQ's own admin tool (``mqadmin consumerProgress``); and a
client's queue locks released on its behalf, as an orderly consumer's own LOCK_BATCH_MQ sees them."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness import polling
from harness.rocketmq.server import RocketMQ
from mqbalance.model import MessageQueue
from mqbalance.rocketmq.admin import AdminError, BrokerAdmin, BrokerQueue, QueueRef, batch_request
from mqbalance.rocketmq.nameserver import invoke
from mqbalance.rocketmq.remoting import RequestCode, ResponseCode, parse_fastjson
from tests.integration.rocketmq.test_lag_offsets import consume, consumer_progress, mq  # noqa: F401 (fixture)


def test_offsets_are_read_searched_written_and_read_back(mq: RocketMQ, topic_name: str) -> None:  # noqa: F811
    topic = topic_name[-40:].lstrip("-")
    group = f"GID_{topic}"[:60]
    mq.create_topic(topic, 2)  # 2 queues on each of the two brokers
    mq.send(topic, 40)
    middle = int(time.time() * 1000)
    time.sleep(0.05)  # a millisecond clock: the later messages are stored after `middle` for sure
    mq.send(topic, 40)
    consume(mq, group, topic, 80)  # a real consumer consumed everything and committed
    admin = BrokerAdmin(timeout=polling.scaled(5))
    queues = {
        MessageQueue(topic, broker, queue_id): QueueRef(mq.broker_addr(broker), topic, queue_id)
        for broker in ("broker-a", "broker-b")
        for queue_id in range(2)
    }

    async def read() -> dict[MessageQueue, tuple[int, int, int, int | None]]:
        return {
            q: (
                await admin.min_offset(ref),
                await admin.max_offset(ref),
                await admin.search_offset(ref, middle),
                await admin.committed_offset(group, ref),
            )
            for q, ref in queues.items()
        }

    # The client writes its offsets oneway as it shuts down (RemoteBrokerOffsetStore.persistAll), and
    # may stop before committing its last messages: the committed offsets read are those RocketMQ's own
    # tool reports, once both agree.
    seen: list[object] = []

    def agreed() -> dict[MessageQueue, tuple[int, int, int, int | None]] | None:
        offsets = asyncio.run(read())
        progress = {q: consumer for q, (_, consumer, _) in consumer_progress(mq, group, topic).items()}
        seen[:] = [offsets, progress]
        # A queue it never committed: not found, 0, or not listed.
        agree = progress.keys() <= offsets.keys() and all(
            (committed or 0) == progress.get(q, 0) for q, (*_, committed) in offsets.items()
        )
        return offsets if agree else None

    before = polling.wait_for(
        "the committed offsets read to equal consumerProgress's", agreed, 30, 0.5, details=lambda: repr(seen)
    )
    assert sum(committed or 0 for *_, committed in before.values()) > 0  # the consumer committed
    assert sum(high for _, high, _, _ in before.values()) == 80
    assert all(low == 0 for low, _, _, _ in before.values())
    # The offset of `middle` splits each queue's messages: those sent before it lie below. 5.x answers
    # the first message stored at `middle` or later; 4.x the one whose time is nearest, which may be the
    # last before it (DefaultMessageStore.getOffsetInQueueByTime): one less in a queue.
    split = sum(found for _, _, found, _ in before.values())
    assert (split == 40) if mq.is_5x else (40 - len(queues) <= split <= 40)
    assert all(0 <= found <= high for _, high, found, _ in before.values())
    never = asyncio.run(admin.committed_offset(f"GID_never_{topic}"[:60], next(iter(queues.values()))))
    # "Not found", or 0 where the queue still starts at 0 in memory (a broker answers so to let a new
    # group start from the beginning: ConsumerManageProcessor).
    assert never in (None, 0)

    # Written back to the offset of `middle`, as a reset to that time writes it with the consumers
    # away, then read back; RocketMQ's own tool reports the same.
    async def write() -> None:
        for q, ref in queues.items():
            await admin.commit_offset(group, ref, before[q][2])

    asyncio.run(write())
    after = asyncio.run(read())
    assert {q: committed for q, (*_, committed) in after.items()} == {q: v[2] for q, v in before.items()}
    progress = consumer_progress(mq, group, topic)
    assert {q: consumer for q, (_, consumer, _) in progress.items()} == {q: v[2] for q, v in before.items()}
    assert {q: broker for q, (broker, _, _) in progress.items()} == {q: v[1] for q, v in before.items()}


def test_a_broker_that_does_not_answer_is_an_admin_error() -> None:
    dead = QueueRef("127.0.0.1:9", "t", 0)  # the discard port: nothing listens
    with pytest.raises(AdminError, match=r"broker 127\.0\.0\.1:9: GET_MAX_OFFSET failed"):
        asyncio.run(BrokerAdmin(timeout=polling.scaled(2)).max_offset(dead))


def lock(address: str, group: str, client_id: str, queues: list[BrokerQueue]) -> set[int]:
    """LOCK_BATCH_MQ as an orderly consumer sends it (RebalanceImpl.lockAll): the queue ids locked."""
    command = batch_request(RequestCode.LOCK_BATCH_MQ, 1, group, client_id, queues)
    response = asyncio.run(invoke(address, command, polling.scaled(5)))
    assert response.code == ResponseCode.SUCCESS, response.remark
    return {int(q["queueId"]) for q in parse_fastjson(response.body).get("lockOKMQSet") or []}


def test_a_clients_locks_are_released_on_its_behalf_and_no_one_elses(mq: RocketMQ, topic_name: str) -> None:  # noqa: F811
    topic = topic_name[-40:].lstrip("-")
    group = f"GID_lock_{topic}"[:60]
    mq.create_topic(topic, 2)
    address = mq.broker_addr("broker-a")
    queues = [BrokerQueue(topic, "broker-a", i) for i in range(2)]
    dead, new, other = "127.0.0.1@dead#1", "127.0.0.1@new#2", "127.0.0.1@other#3"
    assert lock(address, group, dead, queues) == {0, 1}
    assert lock(address, group, new, queues) == set(), "the broker keeps them for their holder (60 s)"
    admin = BrokerAdmin(timeout=polling.scaled(5))
    asyncio.run(admin.unlock(address, group, other, queues))
    assert lock(address, group, new, queues) == set(), "an unlock naming another client frees nothing"
    asyncio.run(admin.unlock(address, group, dead, queues[:1]))
    assert lock(address, group, new, queues) == {0}, "released on the holder's behalf: free at once"
    asyncio.run(admin.unlock(address, group, dead, queues[1:]))
    assert lock(address, group, new, queues) == {0, 1}
    # The new holder's locks stay: an unlock naming the old client now frees nothing.
    asyncio.run(admin.unlock(address, group, dead, queues))
    assert lock(address, group, other, queues) == set()
