"""The Spark side of the replay tests, shared by tests/spark and the integration tests that replay
the operator's own journal: the test session's local Spark session and the comparison of a Spark
replay with the single-process replay. Imports pyspark: import it after
``pytest.importorskip("pyspark")``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from mqbalance.pipeline import scoring, spark_job
from mqbalance.pipeline.main import LineCounts, journal_files, read_journal
from mqbalance.pipeline.replay import FIGURE_SCHEMA, FigureRow, replay

WEIGHTS = scoring.Weights()


def local_session() -> SparkSession:
    """A small local session (``local[2]``, no UI) for the whole test session: starting one takes seconds."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # The driver's ports on loopback only, not on the address the host name resolves to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("mqbalance-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in spark_job.python_conf().items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def expected_frame(spark: SparkSession, rows: Sequence[tuple[object, ...]], schema: str) -> DataFrame:
    return spark.createDataFrame(rows, schema)


def check_figures(spark: SparkSession, figures: DataFrame, expected: list[FigureRow]) -> None:
    """Spark's figures, totals and group summaries equal the single-process ones row for row."""
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


def check_journal(spark: SparkSession, paths: list[str]) -> int:
    """Parse and replay ``paths`` in Spark and in this process; every figure must agree.

    Returns the number of events (journalled generations, over all groups) Spark replayed."""
    counts = LineCounts()
    expected = list(replay(read_journal(journal_files(paths), counts)))
    parsed = spark_job.parse_journal(spark.read.text(paths))
    by_status = {r["status"]: r["count"] for r in parsed.groupBy("status").count().collect()}
    assert by_status.get("skipped", 0) == counts.skipped
    assert by_status.get("invalid", 0) == counts.invalid
    figures = spark_job.replay_events(spark_job.journal_events(parsed))
    check_figures(spark, figures, expected)
    return int(figures.select("namespace", "group", "seq").distinct().count())
