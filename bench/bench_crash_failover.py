"""Crash failover: how soon a crashed consumer's queues are consumed elsewhere, side by side.

    python bench/bench_crash_failover.py [--seconds 40] [--rate 50] [--rounds 1]

One producer, real RocketMQ (harness.rocketmq.releases.version_under_test: two brokers), groups of
RocketMQ's own Java push consumers (concurrent listeners), members 0, 1, 2; once member 1 of every
group has consumed, at 30 % of the sending time member 1 of every group crashes at once: its JVM is
SIGKILLed and started again 5 s later, in the same pod for the mqbalance groups (a container
restart). Per group, for each queue the crashed member had consumed: seconds from the SIGKILL to the
queue's next consumption by another member.

- ``rocketmq``: RocketMQ's own rebalance: the broker sees the channel close and tells the others;
- ``mqbalance-handover``: handover Release; the sidecar sees the application's connections close
  and tells the operator, which gives the queues on at once (docs/sidecar.md, "An application that
  crashes"); the kubelet marks the pod NotReady 1 s after the kill;
- ``mqbalance-handover-unnoticed``: the same with a kubelet that does not notice before the restart
  (the pod stays Ready): the sidecar alone moves the queues.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import failover_rounds, messages_parser

VARIANTS = ("rocketmq", "mqbalance-handover", "mqbalance-handover-unnoticed")
BASE = "rocketmq"


def main() -> int:
    args = messages_parser(__doc__, seconds=40, rate=50).parse_args()
    duplicates = ("duplicates (after the kill)", lambda s: f"{s.duplicates} ({s.duplicates_after_kill})")
    return failover_rounds(args, VARIANTS, BASE, "crash", [duplicates])


if __name__ == "__main__":
    sys.exit(main())
