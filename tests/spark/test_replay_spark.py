"""The Spark job equals the single-process replay, event by event.

The journal test replays the sample journal and, in addition, every journal named
by ``MQBALANCE_REPLAY_JOURNAL`` (paths separated by ``os.pathsep``), such as one
an integration test collected from the operator. ``check_journal`` is the whole
comparison, for other tests to call with their own journal.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from mqbalance.pipeline import sample_journal, scoring, spark_job, synthetic
from mqbalance.pipeline.main import (
    LineCounts,
    Progress,
    Settings,
    journal_files,
    read_journal,
    run_single_process,
    run_spark,
)
from mqbalance.pipeline.replay import FIGURE_SCHEMA, FigureRow, replay

WEIGHTS = scoring.Weights()


def expected_frame(spark: SparkSession, rows: Sequence[tuple[object, ...]], schema: str) -> DataFrame:
    return spark.createDataFrame(rows, schema)


def check_figures(spark: SparkSession, figures: DataFrame, expected: list[FigureRow]) -> None:
    assert expected, "nothing was replayed"
    assertDataFrameEqual(figures, expected_frame(spark, expected, FIGURE_SCHEMA), checkRowOrder=False)
    totals = scoring.totals(expected)
    spark_totals = spark_job.strategy_totals(figures)
    assertDataFrameEqual(
        spark_totals, expected_frame(spark, totals, scoring.TOTALS_SCHEMA), checkRowOrder=False
    )
    assertDataFrameEqual(
        spark_job.group_summaries(spark_totals, WEIGHTS),
        expected_frame(spark, scoring.summaries(totals, WEIGHTS), scoring.SUMMARY_SCHEMA),
        checkRowOrder=False,
    )


def test_synthetic_replay_equals_the_single_process_replay(spark: SparkSession) -> None:
    churn = synthetic.Churn(groups=7, events_per_group=12, zones=3, queues=(2, 5), topics=2, seed=21)
    figures = spark_job.synthetic_figures(spark.range(0, churn.groups, numPartitions=3), churn)
    check_figures(spark, figures, list(replay(synthetic.events(churn))))


def check_journal(spark: SparkSession, paths: list[str]) -> None:
    """Parse and replay ``paths`` in Spark and in this process; every figure must agree."""
    counts = LineCounts()
    expected = list(replay(read_journal(journal_files(paths), counts)))
    parsed = spark_job.parse_journal(spark.read.text(paths))
    by_status = {r["status"]: r["count"] for r in parsed.groupBy("status").count().collect()}
    assert by_status.get("skipped", 0) == counts.skipped
    assert by_status.get("invalid", 0) == counts.invalid
    check_figures(spark, spark_job.replay_events(spark_job.journal_events(parsed)), expected)


def test_journal_replay_equals_the_single_process_replay(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "operator.log"
    sample_journal.write(path, synthetic.Churn(groups=9, events_per_group=8, seed=13))
    check_journal(spark, [str(path)])


@pytest.mark.skipif(not os.environ.get("MQBALANCE_REPLAY_JOURNAL"), reason="MQBALANCE_REPLAY_JOURNAL not set")
def test_given_journal_replay_equals_the_single_process_replay(spark: SparkSession) -> None:
    check_journal(spark, os.environ["MQBALANCE_REPLAY_JOURNAL"].split(os.pathsep))


def test_the_spark_run_reports_what_the_single_process_run_reports(
    spark: SparkSession, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    sample_journal.write(logs / "a.log", synthetic.Churn(groups=5, events_per_group=6, seed=1))
    sample_journal.write(logs / "b.log", synthetic.Churn(groups=3, events_per_group=4, seed=2))

    def settings(out: str) -> Settings:
        return Settings(
            source="logs",
            journal=[str(logs)],
            churn=None,
            out=str(tmp_path / out),
            report_dir=tmp_path / out,
            weights=WEIGHTS,
            master=None,
            partitions=None,
            single_process=False,
        )

    progress = Progress()
    on_spark = run_spark(spark, settings("spark"), progress)
    single = run_single_process(settings("single"), progress)
    assert on_spark == single
    assert on_spark.invalid_lines == 2
    assert spark.read.parquet(str(tmp_path / "spark" / "figures")).count() == len(
        spark.read.parquet(str(tmp_path / "single" / "figures")).collect()
    )
