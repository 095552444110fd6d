"""End to end with real messages: mqbalance beside RocketMQ's own rebalance, in one run.

    python bench/bench_e2e_messages.py --seconds 60 --rate 200 [--variants rocketmq,mqbalance]

A producer sends keyed messages at a steady rate to a real RocketMQ 5.3.3 (two brokers, 8 queues);
each variant is a consumer group of Java push consumers that consumes the whole topic while
members join, one is SIGKILLed, one leaves cleanly and another joins (harness/e2e.py). Prints,
per variant: messages lost, duplicates, the longest time a queue went unconsumed, per-key order
violations, and how long the group took to catch up after the producer stopped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, table
from harness.e2e import SCRIPT, VARIANTS, run, world


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the producer sends")
    parser.add_argument("--rate", type=int, default=200, help="messages a second")
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"any of {', '.join(VARIANTS)}")
    parser.add_argument("--workdir", type=Path, default=None, help="keep every log and record here")
    args = parser.parse_args()
    print(machine())
    with world(args.workdir) as w:
        scores = run(w, args.variants.split(","), seconds=args.seconds, rate=args.rate, keys=args.keys)
    print()
    print(
        "script: members 0, 1, 2 from the start; "
        + "; ".join(f"{s.at:.0%} {s.action} {s.member}" for s in SCRIPT)
    )
    print("each step began and ended (s after the producer started): " + "; ".join(scores[0].events))
    print()
    print(
        table(
            [
                "variant",
                "produced",
                "consumed",
                "lost",
                "duplicates",
                "longest queue gap s",
                "on queue, from s",
                "order violations",
                "caught up s after stop",
            ],
            [
                (
                    s.variant,
                    s.produced,
                    s.consumed,
                    s.lost,
                    s.duplicates,
                    f"{s.longest_gap_s:.2f}",
                    f"{s.gap_queue}, {s.gap_at_s:.1f}",
                    s.order_violations,
                    f"{s.drained_s:.1f}",
                )
                for s in scores
            ],
        )
    )
    return 1 if any(s.lost for s in scores) else 0


if __name__ == "__main__":
    sys.exit(main())
