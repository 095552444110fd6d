"""The replay as Spark transforms: each function takes DataFrames and returns one.

Every figure is computed by :mod:`mqbalance.pipeline.replay` inside the Python
workers; Spark only keeps each group's events together and spreads groups over
executors. Events travel as one compact JSON string per row and figures leave
the workers as Arrow record batches, so the per-row Python cost is the replay
itself. Nothing here creates a SparkSession: ``main()`` does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame, DataFrameReader
from pyspark.sql import functions as F

from mqbalance.pipeline import scoring, synthetic
from mqbalance.pipeline.events import EVENT_SCHEMA, Event, parse_line
from mqbalance.pipeline.replay import FIGURE_SCHEMA, FigureRow, replay_group
from mqbalance.pipeline.report import TOP_GROUPS

BATCH_ROWS = 8192
"""Figure rows per Arrow batch a worker sends back."""

_ARROW_TYPES = {"string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_()}


def arrow_schema(ddl: str) -> pa.Schema:
    """The Arrow schema of a flat ``"name type, ..."`` DDL string (the types used here only)."""
    fields = []
    for part in ddl.split(","):
        name, kind = part.split()
        fields.append(pa.field(name, _ARROW_TYPES[kind]))
    return pa.schema(fields)


FIGURE_ARROW = arrow_schema(FIGURE_SCHEMA)
PARSED_SCHEMA = "status string, " + EVENT_SCHEMA + ", error string"
PARSED_ARROW = arrow_schema(PARSED_SCHEMA)
SUMMARY_ARROW = arrow_schema(scoring.SUMMARY_SCHEMA)


def _batches(rows: Iterator[tuple[object, ...]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    chunk: list[tuple[object, ...]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= BATCH_ROWS:
            yield _batch(chunk, schema)
            chunk = []
    if chunk:
        yield _batch(chunk, schema)


def _batch(rows: list[tuple[object, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns: list[Sequence[object]] = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


# --- journal ---------------------------------------------------------------------------


def parse_journal(lines: DataFrame) -> DataFrame:
    """Text lines (column ``value``, as ``spark.read.text`` gives, and optionally ``file``)
    -> one row per line: ``status`` is ``event``, ``skipped`` (another log line) or
    ``invalid`` (``error`` says why, after the file name when there is a ``file`` column)."""
    has_file = "file" in lines.columns

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def rows() -> Iterator[tuple[object, ...]]:
            for batch in batches:
                values = batch.column("value").to_pylist()
                files = batch.column("file").to_pylist() if has_file else [None] * len(values)
                for line, file in zip(values, files, strict=True):
                    parsed = parse_line(line or "")
                    if parsed.event is not None:
                        yield ("event", *parsed.event.row(), None)
                    elif parsed.error is not None:
                        error = f"{file}: {parsed.error}" if file else parsed.error
                        yield ("invalid", None, None, None, None, None, error)
                    else:
                        yield ("skipped", None, None, None, None, None, None)

        yield from _batches(rows(), PARSED_ARROW)

    return lines.select("value", *(["file"] if has_file else [])).mapInArrow(parse, PARSED_SCHEMA)


def read_lines(reader: DataFrameReader, paths: list[str]) -> DataFrame:
    """Every line of the files, directories (recursively) and globs in ``paths``, with its file name."""
    lines = reader.option("recursiveFileLookup", "true").text(paths)
    return lines.select("value", F.col("_metadata.file_name").alias("file"))


def invalid_example(parsed: DataFrame) -> str:
    """The smallest ``file: error`` text among unreadable records (as the single-process run picks it)."""
    row = parsed.where(F.col("status") == "invalid").agg(F.min("error").alias("error")).first()
    return str(row["error"]) if row and row["error"] else ""


def journal_events(parsed: DataFrame) -> DataFrame:
    """The events of a parsed journal."""
    return parsed.where(F.col("status") == "event").select("namespace", "group", "seq", "time", "event")


# --- replay ----------------------------------------------------------------------------


def replay_events(events: DataFrame) -> DataFrame:
    """Events (``namespace, group, seq, time, event``) in any order and partitioning -> figures
    per event × strategy. Each group's events meet in one task (a shuffle by group)."""

    def replay_table(table: pa.Table) -> pa.Table:
        columns = [table.column(name).to_pylist() for name in ("namespace", "group", "seq", "time", "event")]
        group_events = [Event.from_row(*values) for values in zip(*columns, strict=True)]
        return pa.Table.from_batches(
            list(_batches(replay_group(group_events), FIGURE_ARROW)), schema=FIGURE_ARROW
        )

    return events.groupBy("namespace", "group").applyInArrow(replay_table, FIGURE_SCHEMA)


def synthetic_figures(group_ids: DataFrame, churn: synthetic.Churn) -> DataFrame:
    """Group indexes (column ``id``, e.g. ``spark.range(groups)``) -> figures of their synthetic
    histories. Each task generates its own groups from the seed and replays them at once,
    so events never pass through the driver or a shuffle."""

    def generate_and_replay(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def rows() -> Iterator[FigureRow]:
            for batch in batches:
                for index in batch.column("id").to_pylist():
                    yield from replay_group(synthetic.group_events(churn, index))

        yield from _batches(rows(), FIGURE_ARROW)

    return group_ids.select("id").mapInArrow(generate_and_replay, FIGURE_SCHEMA)


# --- summaries -------------------------------------------------------------------------


def strategy_totals(figures: DataFrame) -> DataFrame:
    """Figures -> group × strategy totals (the columns of :class:`scoring.StrategyTotals`)."""
    last = F.max_by(F.struct("time", "seq", "current"), F.struct("time", "seq"))
    return (
        figures.groupBy("namespace", "group", "strategy")
        .agg(
            F.count(F.lit(1)).alias("events"),
            *[F.sum(c).alias(c) for c in ("moved", "forced", "minimum_moves")],
            *_spread_totals("spread", F.lit(0)),
            *[F.sum(c).alias(c) for c in ("cross_zone", "unassigned", "held")],
            *_spread_totals("load_spread", F.lit(0.0)),
            last.alias("last"),
        )
        .select(
            *[
                F.col(f"last.{c.removeprefix('last_')}").alias(c) if c.startswith("last_") else F.col(c)
                for c in scoring.StrategyTotals._fields
            ]
        )
    )


def _spread_totals(column: str, zero: Column) -> list[Column]:
    """A spread's sum, its sum beyond 1 (balanced) and its largest value: ``<column>_sum``,
    ``excess_<column>``, ``max_<column>`` of :class:`scoring.StrategyTotals`."""
    return [
        F.sum(column).alias(f"{column}_sum"),
        F.sum(F.greatest(F.col(column) - 1, zero)).alias(f"excess_{column}"),
        F.max(column).alias(f"max_{column}"),
    ]


def group_summaries(totals: DataFrame, weights: scoring.Weights) -> DataFrame:
    """Group × strategy totals -> one summary per group with its recommended strategy."""
    fields = scoring.StrategyTotals._fields

    def summarize(table: pa.Table) -> pa.Table:
        columns = [table.column(name).to_pylist() for name in fields]
        group_totals = [scoring.StrategyTotals(*values) for values in zip(*columns, strict=True)]
        summary = scoring.recommend(group_totals, weights)
        return pa.Table.from_batches([_batch([summary], SUMMARY_ARROW)], schema=SUMMARY_ARROW)

    return (
        totals.select(*fields).groupBy("namespace", "group").applyInArrow(summarize, scoring.SUMMARY_SCHEMA)
    )


def strategy_overview(totals: DataFrame, summaries: DataFrame) -> DataFrame:
    """Per-strategy sums over all groups (the columns of :class:`report.StrategyOverview`)."""
    recommended = summaries.groupBy(F.col("recommended").alias("strategy")).agg(
        F.count(F.lit(1)).alias("recommended")
    )
    sums: list[Column] = [F.count(F.lit(1)).alias("groups")]
    sums += [
        F.sum(c).alias(c)
        for c in ("events", "moved", "forced", "minimum_moves", "spread_sum", "excess_spread")
    ]
    sums += [
        F.max("max_spread").alias("max_spread"),
        F.sum("cross_zone").alias("cross_zone"),
        F.sum("held").alias("held"),
        F.sum("load_spread_sum").alias("load_spread_sum"),
        F.max("max_load_spread").alias("max_load_spread"),
    ]
    return (
        totals.groupBy("strategy")
        .agg(*sums)
        .join(recommended, "strategy", "left")
        .fillna(0, subset=["recommended"])
    )


def top_gainers(summaries: DataFrame, limit: int = TOP_GROUPS) -> DataFrame:
    """Groups that would gain most by switching, best first."""
    return summaries.where(F.col("gain") > 0).orderBy(F.desc("gain"), "namespace", "group").limit(limit)


def python_conf() -> dict[str, str]:
    """Spark settings that make the workers run this interpreter, where mqbalance is installed."""
    return {"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable}
