"""The operator's journal file survives a kill in the middle of a record."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqbalance.journal import JournalRecord
from mqbalance.operator.journal import Journal
from tests.unit.test_pipeline_events import record


def write(path: Path, *records: JournalRecord) -> None:
    journal = Journal(str(path))
    try:
        for r in records:
            journal.write(r)
    finally:
        journal.close()


def read(path: Path) -> list[JournalRecord]:
    return [JournalRecord.decode(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("torn_bytes", [1, 593, 100_000])
def test_a_torn_record_is_dropped_before_the_next_start_appends(tmp_path: Path, torn_bytes: int) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, record(generation=1), record(generation=2))
    # What a SIGKILL inside write() leaves: the start of a record, no newline.
    torn = (record(generation=3).encode() * (1 + torn_bytes // 200))[:torn_bytes]
    with path.open("a") as f:
        f.write(torn)

    write(path, record(generation=4))

    assert [r.generation for r in read(path)] == [1, 2, 4]


def test_a_file_holding_only_a_torn_record_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(record(generation=1).encode()[:50])
    write(path, record(generation=2))
    assert [r.generation for r in read(path)] == [2]


def test_complete_records_are_kept_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, record(generation=1))
    before = path.read_bytes()
    write(path, record(generation=2))
    assert path.read_bytes().startswith(before)
    assert [r.generation for r in read(path)] == [1, 2]
