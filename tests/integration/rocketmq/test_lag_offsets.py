"""Lag read by mqbalance equals what RocketMQ's own admin tooling reports, on 4.9.7 and the tested
release (5.5.0 in CI; 5.3.3 with ``make test-rocketmq-lines``).

At rest: messages are produced (RocketMQ's own producer, ``mqadmin checkMsgSendRT``), a real push
consumer of the release's client consumes part of them in a group and shuts down (committing its
offsets), more are produced, and then the lag per queue that :mod:`mqbalance.operator.offsets`
reads equals ``mqadmin consumerProgress``'s ``#Diff`` for the same group, queue by queue. A group
that never committed shows every stored message as lag, as consumerProgress shows it.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import polling
from harness.rocketmq.releases import LEGACY_VERSION, MqadminError, version_under_test
from harness.rocketmq.server import RocketMQ
from mqbalance.lag import group_lag
from mqbalance.model import MessageQueue
from mqbalance.operator.offsets import OffsetReader
from mqbalance.rocketmq.remoting import Credentials

CONSUMER = Path(__file__).resolve().parent / "java" / "LagConsumer.java"


# The 4.x line always (a separate start of about 3 s), and the tested release (the current line
# unless MQBALANCE_ROCKETMQ_VERSION names another: `make test-rocketmq-lines`).
@pytest.fixture(scope="module", params=sorted({LEGACY_VERSION, version_under_test()}))
def mq(request: pytest.FixtureRequest) -> Iterator[RocketMQ]:
    if request.param == version_under_test():
        yield request.getfixturevalue("rocketmq")  # the folder's shared RocketMQ
        return
    with RocketMQ(request.param, brokers=("broker-a", "broker-b")) as running:
        yield running


def consume(mq: RocketMQ, group: str, topic: str, count: int, credentials: Credentials | None = None) -> None:
    """A real push consumer (the release's client) consumes at least ``count`` messages, then stops
    (signing its requests with ``credentials`` when given)."""
    argv = [
        "java",
        "-Xmx128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        f"-Duser.home={mq.workdir}",
        f"-Drmq.log.file={mq.workdir / 'logs' / 'lag-consumer.log'}",  # its log stays in the work directory
        "-Drocketmq.client.logUseSlf4j=false",
        "-cp",
        mq.classpath,
        str(CONSUMER),
        mq.namesrv_addr,
        group,
        topic,
        str(count),
        str(int(polling.scaled(120))),
        *((credentials.access_key, credentials.secret_key) if credentials is not None else ()),
    ]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=polling.scaled(180), check=False, cwd=mq.workdir
    )
    assert result.returncode == 0, f"consumer failed ({result.returncode}):\n{result.stdout}{result.stderr}"


def consumer_progress(mq: RocketMQ, group: str, topic: str) -> dict[MessageQueue, tuple[int, int, int]]:
    """``mqadmin consumerProgress -g GROUP``: (broker offset, consumer offset, diff) per queue."""
    args = ["consumerProgress", "-g", group]
    if mq.is_5x:
        args += ["-t", topic]  # 4.9.x has no -t: it lists every topic the group committed

    def listed() -> dict[MessageQueue, tuple[int, int, int]]:
        rows: dict[MessageQueue, tuple[int, int, int]] = {}
        for line in mq.mqadmin(*args).stdout.splitlines():
            fields = line.split()
            if len(fields) >= 6 and fields[0] == topic:
                rows[MessageQueue(topic, fields[1], int(fields[2]))] = (
                    int(fields[3]),
                    int(fields[4]),
                    int(fields[5]),
                )
        return rows

    # A query that timed out on a loaded machine fails (MqadminError) and is asked again.
    return polling.wait_for(
        f"consumerProgress to list the queues of {topic}", listed, 60, 0.5, retry_on=(MqadminError,)
    )


def test_lag_per_queue_equals_consumer_progress(mq: RocketMQ, topic_name: str) -> None:
    topic = topic_name[-40:].lstrip("-")
    group = f"GID_{topic}"[:60]
    mq.create_topic(topic, 4)  # 4 queues on each of the two brokers
    mq.send(topic, 200)
    consume(mq, group, topic, 60)
    mq.send(topic, 80)

    reader = OffsetReader(mq.namesrv_addr, timeout=polling.scaled(5))
    ours = asyncio.run(reader.read_group(group, [(topic, ())]))
    assert ours.failures == ()
    assert ours.requests == 2  # one GET_CONSUME_STATS per broker
    theirs = consumer_progress(mq, group, topic)
    assert len(theirs) == 8
    assert set(ours.offsets) == set(theirs)
    mine = {q: (o.broker_offset, o.consumer_offset, o.lag) for q, o in ours.offsets.items()}
    assert mine == theirs
    total = sum(diff for _, _, diff in theirs.values())
    assert 80 <= total < 280  # part consumed and committed, the later 80 not
    assert group_lag(ours.offsets, {topic: {}}).total == total

    # A group that never committed: every stored message is lag (consumer offset read as 0).
    never = f"GID_never_{topic}"[:60]
    idle = asyncio.run(reader.read_group(never, [(topic, ())]))
    assert idle.failures == ()
    assert {q: o.lag for q, o in idle.offsets.items()} == {q: b for q, (b, _, _) in theirs.items()}
    assert all(o.consumer_offset == 0 for o in idle.offsets.values())
    if mq.is_5x:  # 4.9.x's consumerProgress lists only topics a group committed
        assert {q: d for q, (_, _, d) in consumer_progress(mq, never, topic).items()} == {
            q: o.lag for q, o in idle.offsets.items()
        }
