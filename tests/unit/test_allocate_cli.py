"""``mqbalance allocate``: request validation, output formats and exit status."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from _pytest.capture import CaptureResult

from mqbalance import allocate_cli
from mqbalance.allocate_cli import handle

QUEUES = [["broker-a", i] for i in range(4)]


def good(**fields: Any) -> dict[str, Any]:
    return {"strategy": "AVG", "queues": QUEUES, "consumers": ["c2", "c1"], **fields}


def run(
    argv: list[str], text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, CaptureResult[str]]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    status = allocate_cli.main(argv)
    return status, capsys.readouterr()


def test_result_has_every_consumer_and_figures() -> None:
    result = handle(good(consumers=["c2", "c1", "c3", "c4", "c5"]))
    assert list(result["assignment"]) == ["c1", "c2", "c3", "c4", "c5"]
    assert result["assignment"]["c5"] == []
    assert result["stats"]["members"] == 5
    assert result["stats"]["maxLoad"] == 1
    assert result["stats"]["minLoad"] == 0
    assert result["stats"]["unassigned"] == 0


def test_default_topic_matters_to_consistent_hash() -> None:
    implicit = handle(good(strategy="CONSISTENT_HASH", queues=[["b", i] for i in range(16)]))
    explicit = handle(
        good(strategy="CONSISTENT_HASH", queues=[["b", i] for i in range(16)], topic="TopicTest")
    )
    other = handle(good(strategy="CONSISTENT_HASH", queues=[["b", i] for i in range(16)], topic="other"))
    assert implicit == explicit
    assert implicit != other


def test_previous_gives_movement_figures() -> None:
    previous = {"c1": [["broker-a", 0], ["broker-a", 1]], "gone": [["broker-a", 2], ["broker-a", 3]]}
    result = handle(good(strategy="STICKY", previous=previous))
    assert result["assignment"] == {
        "c1": [["broker-a", 0], ["broker-a", 1]],
        "c2": [["broker-a", 2], ["broker-a", 3]],
    }
    assert result["stats"]["moved"] == 2
    assert result["stats"]["forced"] == 2
    assert result["stats"]["minimumMoves"] == 2


def test_zones_config_idcs_and_model_are_read() -> None:
    nearby = handle(
        good(
            strategy="MACHINE_ROOM_NEARBY",
            inner="AVG_BY_CIRCLE",
            brokerZones={"broker-a": "z1"},
            consumerZones={"c1": "z1", "c2": "z2"},
        )
    )
    assert nearby["assignment"]["c2"] == []
    assert nearby["stats"]["crossZone"] == 0
    config = handle(
        good(
            strategy="CONFIG",
            config={
                "c2": [{"broker": "broker-a", "queueId": 3}],
                "c9": [{"broker": "broker-a", "queueId": 0}],
            },
        )
    )
    assert config["assignment"] == {"c1": [], "c2": [["broker-a", 3]]}
    assert config["stats"]["unassigned"] == 3
    rooms = handle(good(strategy="MACHINE_ROOM", queues=[["r1@b", 0], ["r2@b", 0]], consumerIdcs=["r2"]))
    assert rooms["assignment"] == {"c1": [["r2@b", 0]], "c2": []}
    broadcast = handle(good(messageModel="BROADCASTING"))
    assert broadcast["assignment"] == {"c1": QUEUES, "c2": QUEUES}


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        ([], "must be an object"),
        ({"queues": [], "consumers": []}, "'strategy' is missing"),
        (good(strategy="ROUND_ROBIN"), "strategy must be one of AVG"),
        (good(queues=[["broker-a", "1"]]), "queues[0] queue id must be a non-negative integer"),
        (good(queues=[["broker-a", True]]), "queue id must be a non-negative integer"),
        (good(queues=[["broker-a"]]), "queues[0] must be [brokerName, queueId]"),
        (good(queues=[["", 1]]), "broker name must be a non-empty string"),
        (good(consumers=["c1", 7]), "a consumer id must be a non-empty string"),
        (good(consumers="c1"), "consumers must be a list"),
        (good(virtualNodes=-1), "virtualNodes must be an integer from 1 to 1000"),
        (good(virtualNodes=0), "virtualNodes must be an integer from 1 to 1000"),
        (good(virtualNodes=1001), "virtualNodes must be an integer from 1 to 1000"),
        (good(inner="STICKY"), "inner is STICKY; use AVG, AVG_BY_CIRCLE, CONSISTENT_HASH"),
        (good(zoneAffinity="yes"), "zoneAffinity must be true or false"),
        (good(messageModel="FANOUT"), "messageModel must be one of CLUSTERING, BROADCASTING"),
        (good(brokerZones={"broker-a": ""}), "brokerZones['broker-a'] must be a non-empty string"),
        (good(previous={"c1": [["broker-a", -2]]}), "previous['c1'][0] queue id"),
        (good(strategy="CONFIG", config=[]), "strategy CONFIG needs config: map member pod names"),
        (
            good(strategy="CONFIG", config=["c1"]),
            "config must map member pod names to lists of {broker, queueId}",
        ),
        (
            good(strategy="CONFIG", config={"c1": [["broker-a", 0]]}),
            "config['c1'][0] needs a broker name, as {broker: broker-a, queueId: 0}",
        ),
        (good(virtualnodes=3, extra=1), "unknown field(s) extra, virtualnodes"),
    ],
)
def test_bad_requests_say_what_is_wrong(request_: Any, words: str) -> None:
    assert words in handle(request_)["error"]


def test_jsonl_keeps_going_after_a_bad_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "\n".join([json.dumps(good(name="one")), "{not json", "", json.dumps(good(name="three"))]) + "\n"
    status, captured = run(["--jsonl", "--format", "json"], text, monkeypatch, capsys)
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert status == 1
    assert [line.get("name") for line in lines] == ["one", None, "three"]
    assert "not valid JSON" in lines[1]["error"]


def test_single_bad_request_exits_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status, captured = run(["--format", "json"], json.dumps(good(strategy=None)), monkeypatch, capsys)
    assert status == 1
    assert "strategy" in json.loads(captured.out)["error"]


def test_usage_errors_exit_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert allocate_cli.main(["--format", "yaml"]) == 2
    assert allocate_cli.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_table_format(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    request = good(
        queues=[["broker-a", 0], ["broker-a", 1], ["broker-a", 3], ["broker-b", 0]], consumers=["c1"]
    )
    status, captured = run(["--format", "table"], json.dumps(request), monkeypatch, capsys)
    assert status == 0
    assert "broker-a:0-1,3 broker-b:0" in captured.out.splitlines()[1]
    assert "1 members, 4 queues" in captured.out


def test_default_format_is_json_when_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status, captured = run([], json.dumps(good()), monkeypatch, capsys)
    assert status == 0
    assert "assignment" in json.loads(captured.out)
