"""Replay benchmark: where Spark pays. The single-process replay, Spark local[1], local[2] and a
standalone cluster side by side, on the same synthetic churn, from small to large numbers of groups.

    python bench/bench_replay.py [--sizes 400,2000,10000,20000,50000] [--events-per-group 50]
                                 [--modes single,local1,local2,standalone] [--rounds 2]
                                 [--single-max-groups 1000]

Every mode replays every event of its groups through every candidate strategy and carries the
figures up to the report: Spark computes the group × strategy totals (written to Parquet, as
``mqbalance replay`` writes them), then scores the groups and collects the per-strategy overview,
the top gainers and the counts, as ``run_spark`` does; the single process keeps the totals in
memory and scores them with ``mqbalance.pipeline.scoring``. Only the per-event figures are not
written (on both sides), so the table compares replay work, not disks.

For each size, each Spark mode gets a driver process of its own (a fresh Python process with
its own JVM), started before the size's first round; its start (session, executors and Python
workers up, by a tiny job) is timed separately and not counted. The groups are split into
``--rounds`` shares; each round runs every mode on its share, in an order that rotates from
round to round, so all modes see the same changes in the machine's load. The single process
replays every K-th group of each share, K chosen so that it replays at most
``--single-max-groups`` groups per size (the table says "1 group in K").

Columns: ``rows/s`` is events × strategies (figure rows) per wall second, ``per CPU-s`` the same
per CPU second of every process the mode used (for Spark the driver's Python and JVM, their
Python workers, and for the standalone cluster the master, the workers, the executors and their
Python workers, read from /proc: Linux only), ``cores`` CPU seconds over wall seconds. The
driver's peak memory is VmHWM (the kernel's peak resident set) of the driver's Python process and
of its JVM, read just before the driver stops; in local mode the executors run inside the
driver's JVM, so its peak includes the tasks' memory.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import table
from mqbalance.pipeline import report, scoring, synthetic
from mqbalance.pipeline.replay import CANDIDATE_LABELS, replay_group

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from harness.spark.cluster import SparkCluster

MODES = ("single", "local1", "local2", "standalone")
MASTERS = {"local1": "local[1]", "local2": "local[2]"}
STRATEGIES = len(CANDIDATE_LABELS)


# --- the single process ------------------------------------------------------------------------


@dataclass
class SingleSide:
    """The single-process replay of sampled groups, totals kept for the report."""

    churn: synthetic.Churn
    step: int
    events: int = 0
    groups: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    totals: list[scoring.StrategyTotals] = field(default_factory=list)

    def run(self, share: range) -> None:
        first = share.start + (-share.start) % self.step
        wall, cpu = time.perf_counter(), time.process_time()
        for index in range(first, share.stop, self.step):
            history = list(synthetic.group_events(self.churn, index))
            self.events += len(history)
            self.groups += 1
            self.totals += scoring.totals(replay_group(history))
        self.seconds += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu

    def finish(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        summaries = scoring.summaries(self.totals, scoring.Weights())
        report.overview(self.totals, summaries)
        report.top_groups(summaries)
        self.totals = []
        self.seconds += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu


# --- a Spark driver, in a process of its own -------------------------------------------------


@dataclass(frozen=True)
class DriverSettings:
    master: str
    cores: int
    env: dict[str, str]
    churn: synthetic.Churn
    workdir: str
    driver_memory: str
    java_opts: str


def spark_session(settings: DriverSettings) -> SparkSession:
    from pyspark.sql import SparkSession

    from mqbalance.pipeline.spark_job import python_conf

    builder = (
        SparkSession.builder.master(settings.master)
        .appName("bench-replay")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.driver.extraJavaOptions", settings.java_opts)
        .config("spark.sql.shuffle.partitions", str(4 * settings.cores))
        .config("spark.local.dir", str(Path(settings.workdir) / "local"))
    )
    for key, value in python_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def warm_up(spark: SparkSession, cores: int) -> None:
    """A job of one Python task per core: executors registered and Python workers started."""
    import pyarrow as pa

    def same(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    spark.range(0, 2 * cores, numPartitions=2 * cores).mapInArrow(same, "id long").write.format("noop").mode(
        "overwrite"
    ).save()


def serve_driver(conn: Connection, settings: DriverSettings, log: str) -> None:
    """The driver process: start a session, then run the jobs ``conn`` asks for until "stop"."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)  # Spark's JVM inherits both: its warnings go to the log, not the table
    os.environ.update(settings.env)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from mqbalance.pipeline import spark_job

    start = time.perf_counter()
    spark = spark_session(settings)
    warm_up(spark, settings.cores)
    conn.send(("ready", time.perf_counter() - start))
    base = Path(settings.workdir)
    shares: list[str] = []
    try:
        while True:
            message = conn.recv()
            start = time.perf_counter()
            if message[0] == "share":
                _, first, stop = message
                ids = spark.range(first, stop, numPartitions=max(1, min(4 * settings.cores, stop - first)))
                figures = spark_job.synthetic_figures(ids, settings.churn)
                path = str(base / "totals" / f"share-{first}")
                spark_job.strategy_totals(figures).write.mode("overwrite").parquet(path)
                shares.append(path)
                conn.send(("done", time.perf_counter() - start))
            elif message[0] == "report":
                # run_spark's tail: score the groups, collect the overview, the top rows and counts.
                totals = spark.read.parquet(*shares)
                groups_path = str(base / "groups")
                spark_job.group_summaries(totals, scoring.Weights()).write.mode("overwrite").parquet(
                    groups_path
                )
                summaries = spark.read.parquet(groups_path)
                spark_job.strategy_overview(totals, summaries).collect()
                spark_job.top_gainers(summaries).collect()
                summaries.agg({"events": "sum", "*": "count"}).first()
                conn.send(("done", time.perf_counter() - start))
            else:
                break
    finally:
        spark.stop()
        conn.send(("stopped", 0.0))


# --- /proc ---------------------------------------------------------------------------------------


def tree_cpu_seconds(roots: Iterable[int]) -> float:
    """CPU seconds (their own and their reaped children's) of ``roots`` and every live descendant."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / ticks


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
                found += children
                stack += children
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the process's peak resident set so far."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def driver_jvm(pid: int) -> int | None:
    """The JVM the driver's Python process launched (``java`` among its descendants)."""
    for child in descendants(pid):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == "java":
                return child
        except OSError:
            continue
    return None


# --- one Spark mode for one size ---------------------------------------------------------------


@dataclass
class SparkSide:
    mode: str
    process: multiprocessing.process.BaseProcess
    conn: Connection
    log: Path
    extra_roots: list[int]
    start_seconds: float = 0.0
    seconds: float = 0.0
    cpu: float = 0.0
    events: int = 0
    groups: int = 0
    python_peak: float = 0.0
    jvm_peak: float = 0.0

    def _call(self, *message: object) -> float:
        assert self.process.pid is not None
        roots = [self.process.pid, *self.extra_roots]
        cpu = tree_cpu_seconds(roots)
        self.conn.send(message)
        seconds = self._reply("done")
        self.cpu += tree_cpu_seconds(roots) - cpu
        self.seconds += seconds
        return seconds

    def _reply(self, expected: str) -> float:
        while not self.conn.poll(1.0):
            if not self.process.is_alive():
                raise RuntimeError(f"the {self.mode} driver exited:\n{tail(self.log)}")
        kind, value = self.conn.recv()
        if kind != expected:
            raise RuntimeError(f"the {self.mode} driver said {kind}:\n{tail(self.log)}")
        return float(value)

    def run(self, share: range, events_per_group: int) -> None:
        self._call("share", share.start, share.stop)
        self.events += len(share) * events_per_group
        self.groups += len(share)

    def finish(self) -> None:
        self._call("report")
        assert self.process.pid is not None
        self.python_peak = peak_rss_mib(self.process.pid)
        jvm = driver_jvm(self.process.pid)
        self.jvm_peak = peak_rss_mib(jvm) if jvm else 0.0
        self.conn.send(("stop",))
        self._reply("stopped")
        self.process.join(60)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start_driver(
    mode: str, churn: synthetic.Churn, workdir: Path, args: argparse.Namespace, cluster: SparkCluster | None
) -> SparkSide:
    from harness.spark.cluster import JAVA_OPTS, processes_in_groups

    if mode == "standalone":
        assert cluster is not None
        master, cores, env = cluster.master_url, cluster.worker_count, cluster.driver_env()
        extra = processes_in_groups(cluster.pgids())
    else:
        master, cores, env, extra = MASTERS[mode], int(MASTERS[mode][6:-1]), {}, []
    directory = workdir / f"{mode}-{churn.groups}"
    directory.mkdir(parents=True)
    settings = DriverSettings(master, cores, env, churn, str(directory), args.driver_memory, JAVA_OPTS)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    log = directory / "driver.log"
    process = context.Process(target=serve_driver, args=(theirs, settings, str(log)), daemon=True)
    process.start()
    side = SparkSide(mode, process, ours, log, extra)
    side.start_seconds = side._reply("ready")
    return side


# --- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    groups: int
    mode: str
    replayed_groups: int
    events: int
    seconds: float
    cpu: float
    start_seconds: float | None
    python_peak: float | None
    jvm_peak: float | None
    note: str

    @property
    def rows(self) -> int:
        return self.events * STRATEGIES

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def run_size(
    groups: int, args: argparse.Namespace, workdir: Path, cluster: SparkCluster | None
) -> list[Cell]:
    churn = synthetic.Churn(
        groups=groups,
        events_per_group=args.events_per_group,
        zones=args.zones,
        queues=synthetic.parse_range(args.queues, "--queues"),
        members=synthetic.parse_range(args.members, "--members"),
        seed=args.seed,
    )
    modes: list[str] = args.modes
    step = max(1, math.ceil(groups / args.single_max_groups))
    single = SingleSide(churn, step)
    sparks: dict[str, SparkSide] = {}
    try:
        for mode in modes:
            if mode != "single":
                sparks[mode] = start_driver(mode, churn, workdir, args, cluster)
        for r in range(args.rounds):
            share = range(groups * r // args.rounds, groups * (r + 1) // args.rounds)
            order = modes[r % len(modes) :] + modes[: r % len(modes)]
            for mode in order:
                if mode == "single":
                    single.run(share)
                else:
                    sparks[mode].run(share, churn.events_per_group)
            print(
                f"  {groups:,} groups, round {r + 1}/{args.rounds} done, "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        cells = []
        if "single" in modes:
            single.finish()
            note = "all groups" if step == 1 else f"1 group in {step}"
            cells.append(
                Cell(
                    groups,
                    "single",
                    single.groups,
                    single.events,
                    single.seconds,
                    single.cpu,
                    None,
                    None,
                    None,
                    note,
                )
            )
        for mode, side in sparks.items():
            side.finish()
            cells.append(
                Cell(
                    groups,
                    mode,
                    side.groups,
                    side.events,
                    side.seconds,
                    side.cpu,
                    side.start_seconds,
                    side.python_peak,
                    side.jvm_peak,
                    "",
                )
            )
    finally:
        for side in sparks.values():
            if side.process.is_alive():
                side.process.kill()
    return cells


def label(mode: str, cluster: SparkCluster | None) -> str:
    if mode == "standalone":
        workers = cluster.worker_count if cluster else 0
        return f"standalone ({workers} × 1-core workers)"
    return "single process" if mode == "single" else f"Spark {MASTERS[mode]}"


def print_results(
    cells: Sequence[Cell], modes: Sequence[str], cluster: SparkCluster | None, cluster_start: float
) -> None:
    singles = {c.groups: c for c in cells if c.mode == "single"}
    rows: list[list[object]] = []
    for c in cells:
        base = singles.get(c.groups)
        rows.append(
            [
                f"{c.groups:,}",
                label(c.mode, cluster) + (f" ({c.note})" if c.note else ""),
                f"{c.events:,}",
                f"{c.seconds:.1f}",
                f"{c.rate:,.0f}",
                f"{c.rate / base.rate:.2f}×" if base else "",
                f"{c.rows / c.cpu:,.0f}" if c.cpu else "",
                f"{c.cpu / c.seconds:.2f}",
                "" if c.start_seconds is None else f"{c.start_seconds:.1f}",
                "" if c.python_peak is None else f"{c.python_peak:,.0f}",
                "" if c.jvm_peak is None else f"{c.jvm_peak:,.0f}",
            ]
        )
    headers = ["groups", "mode", "events", "seconds", "rows/s", "vs single", "per CPU-s", "cores"]
    headers += ["start s", "driver Python MiB", "driver JVM MiB"]
    lines = table(headers, rows).splitlines()
    # Right-aligned numbers but the mode, also in columns the single process leaves empty.
    lines[1] = "|" + "|".join("---" if h == "mode" else "---:" for h in headers) + "|"
    print()
    print("\n".join(lines))
    print(
        f"\nrows: events × {STRATEGIES} strategies; "
        "start s: the driver's session, executors and Python workers up"
    )
    if cluster is not None:
        print(f"standalone cluster start (master and workers, once): {cluster_start:.1f} s")
    sizes = sorted({c.groups for c in cells})
    for mode in modes:
        if mode == "single" or not singles:
            continue
        mine = {c.groups: c for c in cells if c.mode == mode}
        jobs = [g for g in sizes if g in mine and g in singles and mine[g].rate > singles[g].rate]
        whole = [
            g
            for g in sizes
            if g in mine
            and g in singles
            and mine[g].rows / (mine[g].seconds + (mine[g].start_seconds or 0.0)) > singles[g].rate
        ]
        line = f"crossover, {label(mode, cluster)}: "
        line += (
            f"jobs faster from {jobs[0]:,} groups" if jobs else f"jobs not faster up to {sizes[-1]:,} groups"
        )
        line += (
            f"; with its start, from {whole[0]:,} groups"
            if whole
            else f"; with its start, not up to {sizes[-1]:,}"
        )
        peaks = [mine[g].jvm_peak or 0.0 for g in sizes if g in mine and g >= 2000]
        if len(peaks) > 1 and min(peaks) > 0:
            line += f"; driver JVM peak from 2,000 groups: {min(peaks):,.0f}–{max(peaks):,.0f} MiB "
            line += f"(+{max(peaks) / min(peaks) - 1:.0%})"
        print(line)
    for mode in ("local2", "standalone"):
        hit = next((c for c in cells if c.mode == mode and c.groups == 20_000), None)
        if hit and 20_000 in singles:
            print(
                f"target at 20,000 groups: {label(mode, cluster)} "
                f"{hit.rate / singles[20_000].rate:.2f}× single "
                f"(≥ 1.60×), events per group {hit.events // hit.groups}"
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="400,2000,10000,20000,50000", help="groups, comma-separated")
    p.add_argument("--modes", default=",".join(MODES), help="of " + ",".join(MODES))
    p.add_argument("--events-per-group", type=int, default=50)
    p.add_argument("--zones", type=int, default=3)
    p.add_argument("--queues", default="2", help="read queues per broker at the start: N or LO-HI")
    p.add_argument("--members", default="2-6")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--rounds", type=int, default=2, help="shares of each size; every mode runs each share in turn"
    )
    p.add_argument(
        "--single-max-groups",
        type=int,
        default=1000,
        help="the single process replays at most this many groups",
    )
    p.add_argument("--driver-memory", default="1g", help="spark.driver.memory of every Spark mode")
    p.add_argument("--workers", type=int, default=2, help="one-core workers of the standalone cluster")
    args = p.parse_args()
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not sizes or min(sizes) < 1 or args.rounds < 1:
        p.error(f"--modes takes {','.join(MODES)}; --sizes and --rounds positive numbers")
    args.rounds = min(args.rounds, min(sizes))
    print(
        f"replay benchmark: {','.join(f'{s:,}' for s in sizes)} groups × {args.events_per_group} events, "
        f"{STRATEGIES} strategies, queues/broker {args.queues}, {args.zones} zones, members {args.members}; "
        f"modes {','.join(args.modes)}; {args.rounds} rounds; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    cluster: SparkCluster | None = None
    cluster_start = 0.0
    cells: list[Cell] = []
    loads: list[float] = [os.getloadavg()[0]]
    try:
        if "standalone" in args.modes:
            from harness.spark.cluster import SparkCluster

            start = time.perf_counter()
            cluster = SparkCluster(workdir / "cluster", workers=args.workers).start()
            cluster_start = time.perf_counter() - start
        for groups in sizes:
            cells += run_size(groups, args, workdir, cluster)
            loads.append(os.getloadavg()[0])
    except BaseException:
        print(f"failed; logs kept in {workdir}", file=sys.stderr)
        if cluster is not None:
            cluster.stop()
        raise
    if cluster is not None:
        cluster.stop()
    print_results(cells, args.modes, cluster, cluster_start)
    print(f"load average (1 min) at the start and after each size: {', '.join(f'{x:.1f}' for x in loads)}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
