"""Orderly failover: how soon a SIGKILLed orderly consumer's queues are consumed again, side by side.

    python bench/bench_orderly_failover.py [--seconds 60] [--rate 50] [--rounds 1]

One producer, real RocketMQ (harness.rocketmq.releases.version_under_test: two brokers), three
groups of RocketMQ's own Java push consumers with orderly listeners, members 0, 1, 2; at 30 % of the
sending time member 1 of every group is SIGKILLed at once (its pod, for the mqbalance groups, turns
NotReady a second later and is deleted: a lost node, say). Per group, for each queue the dead member
had consumed: seconds from the kill to the queue's next consumption by another member.

- ``rocketmq-orderly``: RocketMQ's own rebalance; the broker's lock (60 s, renewed every 20 s)
  keeps the queues from the others until it expires;
- ``mqbalance-orderly``: handover Orderly with the default lease (``leaseSeconds`` 20,
  ``leaseMarginSeconds`` 5): the queues are handed on once the dead pod's grant has surely expired,
  its broker locks released first;
- ``mqbalance-orderly-lease``: the same with ``leaseSeconds`` 6, ``renewSeconds`` 2,
  ``leaseMarginSeconds`` 2.
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

VARIANTS = ("rocketmq-orderly", "mqbalance-orderly", "mqbalance-orderly-lease")
BASE = "rocketmq-orderly"
KILLED = 1


def main() -> int:
    args = messages_parser(__doc__, rate=50).parse_args()
    print(machine())
    lost = False
    with world(args.workdir) as w:
        for n in range(1, args.rounds + 1):
            load = os.getloadavg()[0]
            tag = f"failover{n}"
            script = (Step(0.3, "kill", KILLED),)
            scores = run(w, VARIANTS, seconds=args.seconds, rate=args.rate, keys=16, script=script, tag=tag)
            lost = lost or any(s.lost for s in scores)
            rows = []
            medians: dict[str, float] = {}
            for s in scores:
                dead, killed_at = next(iter(s.killed_at.items()))
                waits = sorted(failover_waits(w.workdir, f"e2e-{tag}-{s.variant}", dead, killed_at).values())
                medians[s.variant] = statistics.median(waits) if waits else math.nan
                rows.append((s.variant, len(waits), waits, s.lost, s.order_violations))
            print(f"\nround {n}: load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
            print(
                table(
                    [
                        "variant",
                        "queues of the killed member",
                        "kill to next consumption, median s",
                        "max s",
                        f"median vs {BASE}",
                        "lost",
                        "order violations",
                    ],
                    [
                        (
                            variant,
                            queues,
                            f"{medians[variant]:.2f}",
                            f"{max(waits):.2f}" if waits else "-",
                            f"{medians[variant] / medians[BASE]:.2f}x",
                            lost_n,
                            violations,
                        )
                        for variant, queues, waits, lost_n, violations in rows
                    ],
                )
            )
            sys.stdout.flush()
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
