"""How long the local RocketMQ takes to start, and how much memory it holds.

    python bench/bench_rocketmq_start.py --rounds 3

Each round starts a NameServer and two brokers of each release (harness.rocketmq), times
start -> every broker registered, creates a topic of 8 queues per broker, sends 1,000 messages
through RocketMQ's own producer (mqadmin's `checkMsgSendRT`, so the brokers did real work), and
reads each JVM's resident memory from /proc. Prints Markdown tables for docs/rocketmq.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import table
from harness.rocketmq.releases import DEFAULT_VERSION, LEGACY_VERSION
from harness.rocketmq.server import RocketMQ


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_round(version: str) -> dict[str, float]:
    started = time.monotonic()
    with RocketMQ(version, brokers=("broker-a", "broker-b")) as mq:
        ready = time.monotonic() - started
        idle = {name: rss_mb(pid) for name, pid in mq.pids.items()}
        t = time.monotonic()
        mq.create_topic("bench", 8)
        topic = time.monotonic() - t
        mq.mqadmin("checkMsgSendRT", "-t", "bench", "-a", "1000", "-s", "128")
        busy = {name: rss_mb(pid) for name, pid in mq.pids.items()}
    return {
        "ready_s": ready,
        "topic_s": topic,
        "namesrv_idle_mb": idle["namesrv"],
        "broker_idle_mb": statistics.mean(v for k, v in idle.items() if k.startswith("broker")),
        "namesrv_busy_mb": busy["namesrv"],
        "broker_busy_mb": statistics.mean(v for k, v in busy.items() if k.startswith("broker")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--versions", default=f"{DEFAULT_VERSION},{LEGACY_VERSION}")
    args = parser.parse_args()
    print(f"# {platform.node()}: {platform.machine()}, load {Path('/proc/loadavg').read_text().split()[:3]}")
    rows = []
    for version in args.versions.split(","):
        rounds = [one_round(version) for _ in range(args.rounds)]

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        rows.append(
            (
                version,
                args.rounds,
                f"{med('ready_s'):.1f}",
                f"{min(r['ready_s'] for r in rounds):.1f}",
                f"{med('topic_s') * 1000:.0f}",
                f"{med('namesrv_idle_mb'):.0f}",
                f"{med('broker_idle_mb'):.0f}",
                f"{med('namesrv_busy_mb'):.0f}",
                f"{med('broker_busy_mb'):.0f}",
            )
        )
    print(f"# load after: {Path('/proc/loadavg').read_text().split()[:3]}")
    print(
        table(
            [
                "release",
                "rounds",
                "start s (median)",
                "start s (min)",
                "create topic ms",
                "NameServer RSS MB",
                "broker RSS MB",
                "NameServer RSS MB after 1,000 sends",
                "broker RSS MB after",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
