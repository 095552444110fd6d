"""The harness reads mqadmin's answers as they are: failures exit 0, failed sends print false."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from harness.rocketmq.releases import MqadminError
from harness.rocketmq.server import RocketMQ

HEADER = "#Broker Name                      #QID  #Send Result            #RT"


def answer(stdout: str, stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], 0, stdout, stderr)


Answers = Iterator[subprocess.CompletedProcess[str]]


def scripted(monkeypatch: pytest.MonkeyPatch, answers: Answers) -> list[str]:
    """mqadmin's answers in turn, without a JVM; returns the ``-a`` amounts asked for."""
    asked: list[str] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if "checkMsgSendRT" in argv:
            asked.append(argv[argv.index("-a") + 1])
        return next(answers)

    monkeypatch.setattr(subprocess, "run", run)
    return asked


@pytest.fixture
def mq(monkeypatch: pytest.MonkeyPatch) -> RocketMQ:
    rocketmq = RocketMQ(brokers=("broker-a",))
    monkeypatch.setattr(RocketMQ, "namesrv_addr", "127.0.0.1:9876", raising=False)
    monkeypatch.setattr(RocketMQ, "_java", lambda self, heap, name: ["java"])
    monkeypatch.setattr(RocketMQ, "_env", lambda self: {})
    return rocketmq


def test_sends_that_failed_are_made_again_until_all_were_acknowledged(
    mq: RocketMQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = "\n".join([HEADER, "broker-a  0  true  12", "          0  false  3001", "broker-a  1  true  9"])
    second = "\n".join([HEADER, "broker-a  0  true  15"])
    asked = scripted(monkeypatch, iter([answer(first), answer(second)]))
    mq.send("orders", 3)
    assert asked == ["3", "1"]


def test_a_command_that_failed_is_an_error_though_mqadmin_exits_0(
    mq: RocketMQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = "org.apache.rocketmq.tools.command.SubCommandException: TopicStatusSubCommand command failed"
    scripted(monkeypatch, iter([answer("", failed)]))
    with pytest.raises(MqadminError, match="TopicStatusSubCommand command failed"):
        mq.mqadmin("topicStatus", "-t", "orders")
