"""Crash failover: how soon a crashed consumer's queues are consumed elsewhere, side by side.

    python bench/bench_crash_failover.py [--seconds 40] [--rate 50] [--rounds 1]

One producer, real RocketMQ (harness.rocketmq.releases.version_under_test: two brokers), groups of
RocketMQ's own Java push consumers (concurrent listeners), members 0, 1, 2; at 30 % of the sending
time member 1 of every group crashes at once: its JVM is SIGKILLed and started again 5 s later, in
the same pod for the mqbalance groups (a container restart). Per group, for each queue the crashed
member had consumed: seconds from the SIGKILL to the queue's next consumption by another member.

- ``rocketmq``: RocketMQ's own rebalance: the broker sees the channel close and tells the others;
- ``mqbalance-handover``: handover Release; the sidecar sees the application's connections close
  and tells the operator, which gives the queues on at once (docs/sidecar.md, "An application that
  crashes"); the kubelet marks the pod NotReady 1 s after the kill;
- ``mqbalance-handover-unnoticed``: the same with a kubelet that does not notice before the restart
  (the pod stays Ready): the sidecar alone moves the queues.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, messages_parser, table
from harness.e2e import Step, failover_waits, run, world

VARIANTS = ("rocketmq", "mqbalance-handover", "mqbalance-handover-unnoticed")
BASE = "rocketmq"
CRASHED = 1


def main() -> int:
    args = messages_parser(__doc__, seconds=40, rate=50).parse_args()
    print(machine())
    lost = False
    with world(args.workdir) as w:
        for n in range(1, args.rounds + 1):
            load = os.getloadavg()[0]
            tag = f"crash{n}"
            script = (Step(0.3, "crash", CRASHED),)
            scores = run(w, VARIANTS, seconds=args.seconds, rate=args.rate, keys=16, script=script, tag=tag)
            lost = lost or any(s.lost for s in scores)
            rows = []
            medians: dict[str, float] = {}
            for s in scores:
                dead, killed_at = next(iter(s.killed_at.items()))
                waits = sorted(failover_waits(w.workdir, f"e2e-{tag}-{s.variant}", dead, killed_at).values())
                medians[s.variant] = statistics.median(waits) if waits else math.nan
                rows.append((s.variant, len(waits), waits, s.lost, s.duplicates_after_kill, s.duplicates))
            print(f"\nround {n}: load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
            print(
                table(
                    [
                        "variant",
                        "queues of the crashed member",
                        "kill to next consumption elsewhere, median s",
                        "max s",
                        f"median vs {BASE}",
                        "lost",
                        "duplicates (after the kill)",
                    ],
                    [
                        (
                            variant,
                            queues,
                            f"{medians[variant]:.2f}",
                            f"{max(waits):.2f}" if waits else "-",
                            f"{medians[variant] / medians[BASE]:.2f}x",
                            lost_n,
                            f"{dups} ({after})",
                        )
                        for variant, queues, waits, lost_n, after, dups in rows
                    ],
                )
            )
            sys.stdout.flush()
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
