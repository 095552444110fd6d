"""``mqbalance replay --single-process``: the outputs and the command line's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mqbalance.pipeline import sample_journal, synthetic
from mqbalance.pipeline.main import main
from mqbalance.pipeline.replay import CANDIDATE_LABELS, FIGURE_COLUMNS


def test_synthetic_replay_writes_parquet_summary_and_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--synthetic", "--groups", "5", "--events-per-group", "7", "--seed", "3", "--out", str(out)]
    assert main([*argv, "--single-process"]) == 0
    figures = pq.read_table(out / "figures")
    assert figures.column_names == list(FIGURE_COLUMNS)
    assert figures.num_rows == 5 * 7 * len(CANDIDATE_LABELS)
    groups = pq.read_table(out / "groups")
    assert groups.num_rows == 5
    assert pq.read_table(out / "totals").num_rows == 5 * len(CANDIDATE_LABELS)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["groups"], summary["events"]) == (5, 35)
    assert [s["strategy"] for s in summary["strategies"]] == list(CANDIDATE_LABELS)
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_journal_replay_counts_other_lines_and_broken_records(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    churn = synthetic.Churn(groups=3, events_per_group=4, seed=9)
    lines = sample_journal.write(logs / "operator.log", churn)
    assert main(["--journal", str(logs), "--out", str(tmp_path / "out"), "--single-process"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["events"] == 12
    assert summary["invalidLines"] == 1
    assert summary["skippedLines"] == lines - 12 - 1
    assert "not JSON" in summary["invalidExample"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "x", "--single-process"], "either --journal"),
        (["--synthetic", "--journal", "a.log", "--out", "x"], "either --journal"),
        (["--journal", "missing/*.log", "--out", "x", "--single-process"], "matches no file"),
        (["--journal", "s3a://bucket/logs", "--out", "x", "--single-process"], "local files only"),
        (["--synthetic", "--queues", "0", "--out", "x", "--single-process"], "--queues"),
        (["--synthetic", "--out", "s3a://bucket/out"], "--report-dir"),
    ],
)
def test_bad_command_lines_exit_2_and_say_why(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_state_no_strategy_can_allocate_exits_1_naming_the_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = next(sample_journal.records(synthetic.Churn(groups=1, events_per_group=1)))
    broken = record.to_json()
    broken["members"] = dict.fromkeys(broken["members"], "")
    (tmp_path / "operator.log").write_text(json.dumps(broken) + "\n")
    (tmp_path / ".hidden.log").write_text("not read\n")
    argv = ["--journal", str(tmp_path), "--out", str(tmp_path / "out"), "--single-process"]
    assert main(argv) == 1
    assert "shop/group-0000000 event 1, MACHINE_ROOM_NEARBY" in capsys.readouterr().err
