"""Every worked example computed by RocketMQ's own classes passes through ``mqbalance allocate``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mqbalance import allocate_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rocketmq-allocation-examples.jsonl"


def examples() -> list[dict[str, Any]]:
    return [json.loads(line) for line in FIXTURES.read_text().splitlines() if line.strip()]


def request_of(example: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in example.items() if key != "expected"}


def test_the_fixture_file_is_not_empty() -> None:
    assert len(examples()) >= 6


@pytest.mark.parametrize("example", examples(), ids=lambda e: e["name"])
def test_example_from_a_file(
    example: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request_of(example)))
    assert allocate_cli.main([str(path), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["assignment"] == example["expected"]


@pytest.mark.parametrize("example", examples(), ids=lambda e: e["name"])
def test_example_from_stdin(
    example: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(request_of(example))))
    assert allocate_cli.main(["--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["assignment"] == example["expected"]


def test_every_example_through_the_console_command(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(request_of(e)) + "\n" for e in examples()))
    done = subprocess.run(
        [sys.executable, "-m", "mqbalance", "allocate", "--jsonl", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["name"] for r in results] == [e["name"] for e in examples()]
    assert [r["assignment"] for r in results] == [e["expected"] for e in examples()]
