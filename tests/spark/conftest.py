"""One small local Spark session for the whole Spark test session (starting one takes seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the 'spark' extra")

from pyspark.sql import SparkSession  # noqa: E402

from mqbalance.pipeline.spark_job import python_conf  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("mqbalance-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in python_conf().items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
