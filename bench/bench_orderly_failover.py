"""Orderly failover: how soon a SIGKILLed orderly consumer's queues are consumed again, side by side.

    python bench/bench_orderly_failover.py [--seconds 60] [--rate 50] [--rounds 1]

One producer, real RocketMQ (harness.rocketmq.releases.version_under_test: two brokers), three
groups of RocketMQ's own Java push consumers with orderly listeners, members 0, 1, 2; once member 1
of every group has consumed, at 30 % of the sending time member 1 of every group is SIGKILLed at
once (its pod, for the mqbalance groups, turns NotReady a second later and is deleted: a lost node,
say). Per group, for each queue the dead member had consumed: seconds from the kill to the queue's
next consumption by another member.

- ``rocketmq-orderly``: RocketMQ's own rebalance; the broker's lock (60 s, renewed every 20 s)
  keeps the queues from the others until it expires;
- ``mqbalance-orderly``: handover Orderly with the default lease (``leaseSeconds`` 20,
  ``leaseMarginSeconds`` 5): the queues are handed on once the dead pod's grant has surely expired,
  its broker locks released first;
- ``mqbalance-orderly-lease``: the same with ``leaseSeconds`` 6, ``renewSeconds`` 2,
  ``leaseMarginSeconds`` 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import failover_rounds, messages_parser

VARIANTS = ("rocketmq-orderly", "mqbalance-orderly", "mqbalance-orderly-lease")
BASE = "rocketmq-orderly"


def main() -> int:
    args = messages_parser(__doc__, rate=50).parse_args()
    return failover_rounds(args, VARIANTS, BASE, "kill", [("order violations", lambda s: s.order_violations)])


if __name__ == "__main__":
    sys.exit(main())
