"""The Spark job equals the single-process replay, event by event.

The journal test replays the sample journal and, in addition, every journal named
by ``MQBALANCE_REPLAY_JOURNAL`` (paths separated by ``os.pathsep``). The operator's own
journal is replayed the same way by tests/integration/operator/test_journal_replay.py.
``check_journal`` (in tests/spark_support.py, re-exported here) is the whole comparison,
for other tests to call with their own journal.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from mqbalance.pipeline import sample_journal, spark_job, synthetic
from mqbalance.pipeline.main import Progress, Settings, run_single_process, run_spark
from mqbalance.pipeline.replay import LOAD_LABEL, replay
from tests.spark_support import WEIGHTS, check_figures, check_journal

__all__ = ["check_journal"]


def test_synthetic_replay_equals_the_single_process_replay(spark: SparkSession) -> None:
    churn = synthetic.Churn(groups=7, events_per_group=12, zones=3, queues=(2, 5), topics=2, seed=21)
    figures = spark_job.synthetic_figures(spark.range(0, churn.groups, numPartitions=3), churn)
    check_figures(spark, figures, list(replay(synthetic.events(churn))))


def test_synthetic_replay_with_rates_equals_the_single_process_replay(spark: SparkSession) -> None:
    # Zipf rates add the load-aware STICKY and the load spread to every figure and total.
    churn = synthetic.Churn(groups=5, events_per_group=10, queues=(2, 5), topics=2, rate_skew=1.0, seed=22)
    figures = spark_job.synthetic_figures(spark.range(0, churn.groups, numPartitions=2), churn)
    expected = list(replay(synthetic.events(churn)))
    assert any(row.strategy == LOAD_LABEL for row in expected)
    check_figures(spark, figures, expected)


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
