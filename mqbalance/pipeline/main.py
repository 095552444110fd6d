"""``mqbalance replay``: replay rebalance history through every strategy and report.

    mqbalance replay --journal 'logs/operator-*.log' --out replay-out
    mqbalance replay --synthetic --groups 20000 --events-per-group 50 --out what-if
    mqbalance replay --synthetic --single-process --out what-if-local   # no Spark

Output (``--out``): ``figures/`` (per event × strategy), ``totals/`` (per group ×
strategy) and ``groups/`` (per group, with the recommendation) as Parquet, plus
``summary.json`` and ``report.html`` (written to ``--report-dir``, by default ``--out``).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqbalance.pipeline import report, scoring, synthetic
from mqbalance.pipeline.events import Event, parse_line
from mqbalance.pipeline.replay import FIGURE_COLUMNS, FigureRow, ReplayError, replay

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class UsageError(ValueError):
    """A command line that cannot run; the message says what to change."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mqbalance replay",
        description="Replay rebalance journals or synthetic churn through every strategy (PySpark).",
    )
    source = p.add_argument_group("input (one of)")
    source.add_argument(
        "--journal",
        nargs="+",
        metavar="PATH",
        help="journal files, directories, globs or Spark URIs (s3a://, hdfs://)",
    )
    source.add_argument(
        "--synthetic", action="store_true", help="generate churn instead of reading a journal"
    )
    syn = p.add_argument_group("synthetic churn")
    syn.add_argument("--groups", type=int, default=100)
    syn.add_argument("--events-per-group", type=int, default=20)
    syn.add_argument("--zones", type=int, default=3, help="zones, one broker in each")
    syn.add_argument(
        "--queues", default="4", help="read queues per broker and topic at the start: N or LO-HI"
    )
    syn.add_argument("--members", default="2-8", help="members at the start: N or LO-HI")
    syn.add_argument("--topics", type=int, default=1, help="topics each group consumes")
    syn.add_argument(
        "--mix", default="join=3,leave=3,zone=1,queues=1", help="relative weights of the changes"
    )
    syn.add_argument("--seed", type=int, default=1)
    syn.add_argument(
        "--rate-skew",
        type=float,
        default=0.0,
        help="Zipf exponent of per-queue rates (0: none); with rates the load-aware STICKY is replayed too",
    )
    syn.add_argument("--rate-jitter", type=float, default=0.1, help="each rate varies by up to this fraction")
    out = p.add_argument_group("output and scoring")
    out.add_argument("--out", required=True, help="output directory (a Spark URI with Spark)")
    out.add_argument("--report-dir", help="local directory for report.html and summary.json (default: --out)")
    out.add_argument("--spread-weight", type=float, default=scoring.Weights.spread)
    out.add_argument("--zone-weight", type=float, default=scoring.Weights.zone)
    out.add_argument("--unassigned-weight", type=float, default=scoring.Weights.unassigned)
    out.add_argument("--load-weight", type=float, default=scoring.Weights.load)
    run = p.add_argument_group("execution")
    run.add_argument(
        "--master", help="Spark master (default: spark-submit's, else local[*] to run here without a cluster)"
    )
    run.add_argument("--partitions", type=int, help="synthetic: Spark partitions (default: 4 per core)")
    run.add_argument("--single-process", action="store_true", help="replay in this process without Spark")
    return p


@dataclass(frozen=True)
class Settings:
    source: str
    journal: list[str] | None
    churn: synthetic.Churn | None
    out: str
    report_dir: Path
    weights: scoring.Weights
    master: str | None
    partitions: int | None
    single_process: bool


def settings_from(args: argparse.Namespace) -> Settings:
    if bool(args.journal) == bool(args.synthetic):
        raise UsageError("give either --journal PATH... or --synthetic")
    churn = None
    if args.synthetic:
        churn = synthetic.Churn(
            groups=args.groups,
            events_per_group=args.events_per_group,
            zones=args.zones,
            queues=synthetic.parse_range(args.queues, "--queues"),
            members=synthetic.parse_range(args.members, "--members"),
            topics=args.topics,
            mix=synthetic.parse_mix(args.mix),
            seed=args.seed,
            rate_skew=args.rate_skew,
            rate_jitter=args.rate_jitter,
        )
        source = (
            f"synthetic: {churn.groups} groups × {churn.events_per_group} events, {churn.zones} zones, "
            f"queues {args.queues}, members {args.members}, mix {args.mix}, seed {churn.seed}"
        )
        if churn.rate_skew:
            source += f", rates Zipf {churn.rate_skew:g} ± {churn.rate_jitter:g}"
    else:
        source = " ".join(args.journal)
    if args.report_dir:
        report_dir = Path(args.report_dir)
    elif _is_uri(args.out):
        raise UsageError(f"--out {args.out} is not a local directory; add --report-dir DIR for report.html")
    else:
        report_dir = Path(args.out.removeprefix("file://"))
    if args.partitions is not None and args.partitions < 1:
        raise UsageError("--partitions must be at least 1")
    return Settings(
        source=source,
        journal=args.journal,
        churn=churn,
        out=args.out,
        report_dir=report_dir,
        weights=scoring.Weights(
            spread=args.spread_weight,
            zone=args.zone_weight,
            unassigned=args.unassigned_weight,
            load=args.load_weight,
        ),
        master=args.master,
        partitions=args.partitions,
        single_process=args.single_process,
    )


def _is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


class Progress:
    """Stage messages with the time since start, on stderr."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[replay {time.perf_counter() - self.start:7.1f}s] {message}", file=sys.stderr, flush=True)


@dataclass
class LineCounts:
    skipped: int = 0
    invalid: int = 0
    invalid_example: str = ""
    """The smallest ``file: error`` text among the broken records."""


# --- single process --------------------------------------------------------------------


def journal_files(paths: Sequence[str]) -> list[Path]:
    """Local files named by paths, directories (recursively) and globs, sorted and deduplicated."""
    files: set[Path] = set()
    for raw in paths:
        if _is_uri(raw):
            raise UsageError(f"{raw}: --single-process reads local files only; run with Spark for URIs")
        path = raw.removeprefix("file://")
        matches = glob.glob(path, recursive=True) if glob.has_magic(path) else [path]
        if not matches or not all(os.path.exists(m) for m in matches):
            raise UsageError(f"journal path {raw!r} matches no file")
        for match in map(Path, matches):
            if match.is_dir():
                # Hidden and underscore files are skipped, as Spark's file sources skip them.
                files.update(p for p in match.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
            else:
                files.add(match)
    return sorted(files)


def read_journal(files: Sequence[Path], counts: LineCounts) -> Iterator[Event]:
    for path in files:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                parsed = parse_line(line)
                if parsed.event is not None:
                    yield parsed.event
                elif parsed.error is not None:
                    counts.invalid += 1
                    example = f"{path.name}: {parsed.error}"
                    # The smallest, as the Spark run picks it, so both runs report the same line.
                    counts.invalid_example = min(counts.invalid_example or example, example)
                else:
                    counts.skipped += 1


def single_process_figures(settings: Settings, counts: LineCounts) -> list[FigureRow]:
    """Every figure row of the replay, computed in this process."""
    if settings.churn is not None:
        return list(replay(synthetic.events(settings.churn)))
    assert settings.journal is not None
    return list(replay(read_journal(journal_files(settings.journal), counts)))


def run_single_process(settings: Settings, progress: Progress) -> report.ReportData:
    import pyarrow as pa
    import pyarrow.parquet as pq

    counts = LineCounts()
    progress("replaying in this process")
    figures = single_process_figures(settings, counts)
    progress(f"{len(figures):,} figure rows; scoring")
    totals = scoring.totals(figures)
    summaries = scoring.summaries(totals, settings.weights)
    out = Path(settings.out.removeprefix("file://"))
    for name, rows, fields in (
        ("figures", figures, FIGURE_COLUMNS),
        ("totals", totals, scoring.StrategyTotals._fields),
        ("groups", summaries, scoring.GroupSummary._fields),
    ):
        (out / name).mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist([dict(zip(fields, r, strict=True)) for r in rows])
        pq.write_table(table, out / name / "part-00000.parquet")
    return report.ReportData(
        source=settings.source,
        groups=len(summaries),
        events=sum(s.events for s in summaries),
        skipped_lines=counts.skipped,
        invalid_lines=counts.invalid,
        invalid_example=counts.invalid_example,
        weights=settings.weights,
        strategies=report.overview(totals, summaries),
        top_groups=report.top_groups(summaries),
    )


# --- Spark -----------------------------------------------------------------------------


def spark_session(master: str | None) -> SparkSession:
    """A session for the replay: here (``local[*]``) or as spark-submit configured it."""
    from pyspark.sql import SparkSession

    from mqbalance.pipeline.spark_job import python_conf

    builder = SparkSession.builder.appName("mqbalance-replay").config("spark.ui.showConsoleProgress", "true")
    # spark-submit starts the JVM first and passes its gateway; its --master and
    # spark.pyspark.python settings stand, since executors may keep Python elsewhere.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master or not submitted:
        builder = builder.master(master or "local[*]")
    if not submitted:
        # Workers must run this interpreter, where mqbalance and its dependencies live.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        for key, value in python_conf().items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run_spark(spark: SparkSession, settings: Settings, progress: Progress) -> report.ReportData:
    """The replay on ``spark``; Parquet goes to ``settings.out``."""
    from mqbalance.pipeline import spark_job

    out = settings.out.rstrip("/")
    counts = LineCounts()
    if settings.churn is not None:
        partitions = settings.partitions or 4 * spark.sparkContext.defaultParallelism
        progress(
            f"generating and replaying {settings.churn.total_events:,} synthetic events "
            f"in {partitions} partitions"
        )
        ids = spark.range(0, settings.churn.groups, numPartitions=min(partitions, settings.churn.groups))
        figures = spark_job.synthetic_figures(ids, settings.churn)
    else:
        assert settings.journal is not None
        progress(f"reading journal {settings.source}")
        parsed = spark_job.parse_journal(spark_job.read_lines(spark.read, settings.journal)).cache()
        by_status = {r["status"]: r["count"] for r in parsed.groupBy("status").count().collect()}
        counts.skipped, counts.invalid = by_status.get("skipped", 0), by_status.get("invalid", 0)
        if counts.invalid:
            counts.invalid_example = spark_job.invalid_example(parsed)
        progress(f"{by_status.get('event', 0):,} journal records, {counts.skipped:,} other lines; replaying")
        figures = spark_job.replay_events(spark_job.journal_events(parsed))
    figures.write.mode("overwrite").parquet(f"{out}/figures")
    progress("figures written; totalling per group and strategy")
    spark_job.strategy_totals(spark.read.parquet(f"{out}/figures")).write.mode("overwrite").parquet(
        f"{out}/totals"
    )
    totals = spark.read.parquet(f"{out}/totals")
    progress("scoring groups")
    spark_job.group_summaries(totals, settings.weights).write.mode("overwrite").parquet(f"{out}/groups")
    summaries = spark.read.parquet(f"{out}/groups")
    progress("collecting the report")
    strategies = [
        report.StrategyOverview(**{f: row[f] for f in report.StrategyOverview._fields})
        for row in spark_job.strategy_overview(totals, summaries).collect()
    ]
    top = [
        scoring.GroupSummary(**{f: row[f] for f in scoring.GroupSummary._fields})
        for row in spark_job.top_gainers(summaries).collect()
    ]
    sizes = summaries.agg({"events": "sum", "*": "count"}).first()
    assert sizes is not None
    return report.ReportData(
        source=settings.source,
        groups=int(sizes["count(1)"]),
        events=int(sizes["sum(events)"] or 0),
        skipped_lines=counts.skipped,
        invalid_lines=counts.invalid,
        invalid_example=counts.invalid_example,
        weights=settings.weights,
        strategies=sorted(strategies, key=lambda s: report.strategy_order(s.strategy)),
        top_groups=top,
    )


def write_report(data: report.ReportData, report_dir: Path, extra: dict[str, Any] | None = None) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    summary = {**data.to_json(), **(extra or {})}
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    path = report_dir / "report.html"
    path.write_text(report.render(data), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except ValueError as e:
        print(f"mqbalance replay: {e}", file=sys.stderr)
        return 2
    progress = Progress()
    try:
        if settings.single_process:
            data = run_single_process(settings, progress)
        else:
            spark = spark_session(settings.master)
            try:
                data = run_spark(spark, settings, progress)
            finally:
                spark.stop()
    except UsageError as e:
        print(f"mqbalance replay: {e}", file=sys.stderr)
        return 2
    except ReplayError as e:
        print(f"mqbalance replay: {e}", file=sys.stderr)
        return 1
    path = write_report(
        data, settings.report_dir, {"seconds": round(time.perf_counter() - progress.start, 3)}
    )
    progress(f"{data.groups:,} groups, {data.events:,} events; report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
