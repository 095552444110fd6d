"""harness.rocketmq.broker_client: the broker connection of the pod apps, and how it reaches their pods."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.apps.pods import CONSUMER_APP, LAG_CONSUMER_APP, pod_app_command
from harness.rocketmq.broker_client import (
    PULL_OFFSET_MOVED,
    QUERY_NOT_FOUND,
    Broker,
    BrokerError,
    OffsetMoved,
    read_exactly,
)
from mqbalance.rocketmq.remoting import FLAG_RESPONSE, RemotingCommand, decode_payload, encode, frame_length

POD_APPS = (CONSUMER_APP, LAG_CONSUMER_APP)

Answer = Callable[[RemotingCommand], list[RemotingCommand]]


@pytest.fixture
def broker_answering() -> Iterator[Callable[[Answer], str]]:
    """A one-connection broker on loopback answering each request with the frames ``answer`` gives."""
    listener = socket.create_server(("127.0.0.1", 0))

    def start(answer: Answer) -> str:
        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                while True:
                    try:
                        command = decode_payload(read_exactly(conn, frame_length(read_exactly(conn, 4))))
                    except ConnectionError:
                        return
                    conn.sendall(b"".join(encode(c) for c in answer(command)))

        threading.Thread(target=serve, daemon=True).start()
        return f"127.0.0.1:{listener.getsockname()[1]}"

    yield start
    listener.close()


def response(to: RemotingCommand, code: int, **fields: str) -> RemotingCommand:
    return RemotingCommand(code, to.opaque, FLAG_RESPONSE, fields)


def test_a_call_skips_the_brokers_own_requests_and_reads_the_answer(
    broker_answering: Callable[[Answer], str],
) -> None:
    def answer(command: RemotingCommand) -> list[RemotingCommand]:
        notify = RemotingCommand(40, 99)  # NOTIFY_CONSUMER_IDS_CHANGED: a request, not the answer
        offset = "0" if command.ext_fields["queueId"] == "0" else "17"
        code = QUERY_NOT_FOUND if command.ext_fields["queueId"] == "0" else 0
        return [notify, response(command, code, offset=offset)]

    broker = Broker(broker_answering(answer), "g", "t")
    assert broker.committed(0) == 0
    assert broker.committed(1) == 17
    broker.close()


def test_a_pull_from_a_moved_offset_says_where_to_go_on(broker_answering: Callable[[Answer], str]) -> None:
    def answer(command: RemotingCommand) -> list[RemotingCommand]:
        assert (command.ext_fields["consumerGroup"], command.ext_fields["maxMsgNums"]) == ("g", "8")
        return [response(command, PULL_OFFSET_MOVED, nextBeginOffset="40")]

    broker = Broker(broker_answering(answer), "g", "t")
    with pytest.raises(OffsetMoved) as moved:
        broker.pull(2, 5, 8)
    assert moved.value.next_offset == 40
    broker.close()


def test_an_unreachable_broker_is_a_broker_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
    with pytest.raises(BrokerError, match=address):
        Broker(address, "g", "t").committed(0)


def test_the_pod_command_gives_the_app_the_module_where_the_harness_is_not(tmp_path: Path) -> None:
    # The check means something only if the harness cannot be imported there.
    missing = subprocess.run(
        [sys.executable, "-c", "import harness"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert "ModuleNotFoundError" in missing.stderr
    app = tmp_path / "app.py"
    app.write_text(
        "from __future__ import annotations\n"
        "from harness.rocketmq.broker_client import Broker\n"
        "def main() -> None:\n"
        "    print(Broker.__module__, Broker('127.0.0.1:1').timeout)\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    command = pod_app_command(app)
    assert command[:2] == ["python", "-c"]
    result = subprocess.run(
        [sys.executable, *command[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "harness.rocketmq.broker_client 2.0\n"


def harness_imports(source: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module in ("harness", "harness.rocketmq"):
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return {m for m in found if m.split(".")[0] == "harness"}


@pytest.mark.parametrize("app", POD_APPS, ids=lambda app: app.name)
def test_the_pod_apps_import_no_other_harness_module(app: Path) -> None:
    assert harness_imports(app.read_text()) == {"harness.rocketmq.broker_client"}
