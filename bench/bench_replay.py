"""Replay benchmark: Spark local[N] beside the single-process replay of the same events.

    python bench/bench_replay.py [--groups 20000 --events-per-group 50] [--master local[2]]
                                 [--single-sample 10] [--rounds 4]

Both sides generate the same synthetic churn (the seed fixes every group) and replay
every event through every candidate strategy; the figures are consumed without
writing them (Spark: the ``noop`` sink; single process: counted), so the table
compares replay work, not disks. Spark's time is the wall time of its jobs after the
session is up (Python workers start inside them); the session start is printed beside.

The groups are split into ``--rounds`` shares. Each round replays every
``--single-sample``-th group of its share in this process, then the whole share on
Spark, so both sides run under the same changes in the machine's load. The
single-process rate is events/second over the sampled groups; ``--single-sample 1``
replays all of them (about as long as the Spark jobs times the number of cores).

"cores used" is CPU seconds over wall seconds: on a shared machine it shows how much
of the machine each side actually got (Spark's CPU is read from /proc, so Linux only).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from mqbalance.pipeline import synthetic
from mqbalance.pipeline.replay import CANDIDATE_LABELS, replay_group

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def single_process(churn: synthetic.Churn, indexes: range) -> tuple[int, int, float]:
    """(events, figure rows, seconds) replaying the groups ``indexes`` in this process."""
    events = rows = 0
    start = time.perf_counter()
    for index in indexes:
        history = list(synthetic.group_events(churn, index))
        events += len(history)
        rows += sum(1 for _ in replay_group(history))
    return events, rows, time.perf_counter() - start


def descendants_cpu_seconds() -> float:
    """CPU seconds of every process started from this one (Spark's JVM and its Python
    workers, with their reaped children), read from Linux's /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    stack = [os.getpid()]
    seen = set()
    while stack:
        pid = stack.pop()
        try:
            children = []
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children += [int(c) for c in f.read().split()]
            if pid != os.getpid():
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        except (FileNotFoundError, ProcessLookupError):
            continue
        stack += [c for c in children if c not in seen]
        seen.update(children)
    return total / ticks


def spark_session(master: str) -> SparkSession:
    from pyspark.sql import SparkSession

    from mqbalance.pipeline.spark_job import python_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName("bench-replay").config("spark.ui.enabled", "false")
    for key, value in python_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def on_spark(spark: SparkSession, churn: synthetic.Churn, groups: range, partitions: int) -> float:
    """Seconds to replay the groups ``groups`` on ``spark`` (figures to the noop sink)."""
    from mqbalance.pipeline.spark_job import synthetic_figures

    start = time.perf_counter()
    ids = spark.range(groups.start, groups.stop, numPartitions=partitions)
    synthetic_figures(ids, churn).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=20_000)
    p.add_argument("--events-per-group", type=int, default=50)
    p.add_argument("--zones", type=int, default=3)
    p.add_argument("--queues", default="2", help="read queues per broker at the start: N or LO-HI")
    p.add_argument("--members", default="2-6")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--partitions", type=int, default=24, help="Spark partitions per round")
    p.add_argument("--rounds", type=int, default=4, help="alternations of single-process and Spark work")
    p.add_argument("--single-sample", type=int, default=10, help="replay every K-th group in one process")
    args = p.parse_args()
    churn = synthetic.Churn(
        groups=args.groups,
        events_per_group=args.events_per_group,
        zones=args.zones,
        queues=synthetic.parse_range(args.queues, "--queues"),
        members=synthetic.parse_range(args.members, "--members"),
        seed=args.seed,
    )
    print(
        f"replay benchmark: {churn.groups:,} groups × {churn.events_per_group} events "
        f"= {churn.total_events:,} "
        f"group-events, {len(CANDIDATE_LABELS)} strategies each, queues/broker {args.queues}, "
        f"{churn.zones} zones, members {args.members}",
        flush=True,
    )
    # The run alternates: a slice of the single-process sample, then a Spark job over the
    # next share of the groups, and so on; a change in the machine's load during the run
    # then weighs on both sides alike.
    start = time.perf_counter()
    spark = spark_session(args.master)
    session_seconds = time.perf_counter() - start
    step, rounds = args.single_sample, args.rounds
    single_events = single_rows = 0
    single_seconds = spark_seconds = single_cpu = spark_cpu = 0.0
    try:
        for r in range(rounds):
            share = range(churn.groups * r // rounds, churn.groups * (r + 1) // rounds)
            first = share.start + (-share.start) % step
            cpu = time.process_time()
            events, rows_done, seconds = single_process(churn, range(first, share.stop, step))
            single_cpu += time.process_time() - cpu
            single_events, single_rows, single_seconds = (
                single_events + events,
                single_rows + rows_done,
                single_seconds + seconds,
            )
            cpu = descendants_cpu_seconds()
            spark_seconds += on_spark(spark, churn, share, args.partitions)
            spark_cpu += descendants_cpu_seconds() - cpu
            print(
                f"round {r + 1}/{rounds}: single {events / seconds:,.0f} events/s, "
                f"Spark total so far {share.stop * churn.events_per_group / spark_seconds:,.0f} events/s, "
                f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
                flush=True,
            )
    finally:
        spark.stop()
    rows = churn.total_events * len(CANDIDATE_LABELS)
    spark_rate = churn.total_events / spark_seconds
    single_rate = single_events / single_seconds
    sampled = "all groups" if args.single_sample == 1 else f"every {args.single_sample}th group"
    print()
    print("| run | group-events | figure rows | seconds | events/s | vs single | CPU seconds | cores used |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| single process ({sampled}) | {single_events:,} | {single_rows:,} | {single_seconds:.1f} "
        f"| {single_rate:,.0f} | 1.00× | {single_cpu:.1f} | {single_cpu / single_seconds:.2f} |"
    )
    print(
        f"| Spark {args.master} | {churn.total_events:,} | {rows:,} | {spark_seconds:.1f} "
        f"| {spark_rate:,.0f} | {spark_rate / single_rate:.2f}× | {spark_cpu:.1f} "
        f"| {spark_cpu / spark_seconds:.2f} |"
    )
    print(
        f"\nevents per CPU second: single {single_events / single_cpu:,.0f}, "
        f"Spark (JVM and workers) {churn.total_events / spark_cpu:,.0f}"
    )
    print(
        f"Spark session start (not counted): {session_seconds:.1f} s; target: local[2] ≥ 1.50× single process"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
