"""End to end with real messages: every way of balancing side by side, in one run.

    python bench/bench_e2e_messages.py --seconds 90 --rate 200 [--variants ...] [--rounds 3]

A producer sends keyed messages at a steady rate to a real RocketMQ 5.3.3 (two brokers, 8 queues);
each variant is a consumer group of Java push consumers that consumes the whole topic while
members join, one is SIGKILLed, one leaves cleanly and another joins (harness/e2e.py): RocketMQ's
own rebalance, mqbalance in one step, mqbalance with the handover (Release), and the orderly pair
(RocketMQ's rebalance with orderly consumers, mqbalance with the Orderly handover). Prints, per
variant: messages lost, duplicates (of rebalances between live members, and after the SIGKILL),
the longest time a queue went unconsumed, per-key order violations, how long the group took to
catch up after the producer stopped, the time from each message's send to its first consumption
(median, p99, max); and for the mqbalance variants what the handover costs: how
long each queue that moved between live members went unconsumed (from the generation that took
it from its old owner to the first consumption by its new owner), beside the one-step path's, and
where a move's time goes: the medians of its steps, from the change the operator answered to its
generation, and on each side's sidecar from the generation's receipt (docs/sidecar.md, "The trace of
a move").
``--rounds`` repeats the run in the same world, each round with consumer groups of its own;
``--graceful`` has member 1 leave cleanly instead of the SIGKILL (only moves between live members).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, messages_parser, table
from harness.e2e import SCRIPT, VARIANTS, Score, run, world
from harness.e2e_moves import NEW_OWNER_STEPS, OLD_OWNER_STEPS

ONE_STEP = "mqbalance"
DEFAULT_VARIANTS = ("rocketmq", ONE_STEP, "mqbalance-handover", "rocketmq-orderly", "mqbalance-orderly")


def _f(x: float, digits: int = 2) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def scores_table(scores: list[Score]) -> str:
    return table(
        [
            "variant",
            "produced",
            "consumed",
            "lost",
            "duplicates, live rebalances",
            "duplicates after the SIGKILL",
            "longest queue gap s",
            "on queue, from s",
            "order violations",
            "caught up s after stop",
            "send to first consumption, median / p99 / max ms",
        ],
        [
            (
                s.variant,
                s.produced,
                s.consumed,
                s.lost,
                s.duplicates - s.duplicates_after_kill,
                s.duplicates_after_kill,
                _f(s.longest_gap_s),
                f"{s.gap_queue}, {_f(s.gap_at_s, 1)}",
                s.order_violations,
                _f(s.drained_s, 1),
                " / ".join(_f(ms, 0) for ms in s.latency_ms),
            )
            for s in scores
        ],
    )


def cost_table(scores: list[Score]) -> str:
    """How long moving queues went unconsumed, beside the one-step path of the same run."""
    base = next((s.moves for s in scores if s.variant == ONE_STEP and s.moves), None)
    rows = []
    for s in scores:
        m = s.moves
        if m is None:
            continue
        ratio = m.unconsumed_median_s / base.unconsumed_median_s if base and base.moves else float("nan")
        ratio_max = m.unconsumed_max_s / base.unconsumed_max_s if base and base.moves else float("nan")
        rows.append(
            (
                s.variant,
                m.moves,
                _f(m.waited_median_s),
                _f(m.unconsumed_median_s),
                _f(m.unconsumed_max_s),
                f"{_f(ratio)}x",
                f"{_f(ratio_max)}x",
            )
        )
    return table(
        [
            "variant",
            "queues moved between live members",
            "revoked to assigned, median s",
            "unconsumed, median s",
            "unconsumed, max s",
            f"median vs {ONE_STEP}",
            f"max vs {ONE_STEP}",
        ],
        rows,
    )


JOINING_STEPS = ("read", "pulled", "consumed")
"""The steps shown of a joining pod's first move (its application had just started)."""


def trace_table(scores: list[Score]) -> str:
    """Where a move's time goes: the medians of its steps, the operator's and each side's sidecar's."""
    rows = []
    for s in scores:
        t = s.trace
        if t is None:
            continue
        old, new = t.old_owner_ms, t.new_owner_ms
        rows.append(
            (
                s.variant,
                t.moves,
                _f(t.generation_ms, 0),
                *(_f(old[step], 0) for step in OLD_OWNER_STEPS),
                *(_f(new[step], 0) for step in NEW_OWNER_STEPS),
                *(_f(t.joining_ms[step], 0) for step in JOINING_STEPS),
            )
        )
    return table(
        [
            "variant",
            "move lines",
            "change to generation",
            *(f"old owner: {step}" for step in OLD_OWNER_STEPS),
            *(f"new owner: {step}" for step in NEW_OWNER_STEPS),
            *(f"joining pod: {step}" for step in JOINING_STEPS),
        ],
        rows,
    )


def main() -> int:
    parser = messages_parser(__doc__, rate=200)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"any of {', '.join(VARIANTS)} (default: the five of docs/benchmarks.md, section 6)",
    )
    parser.add_argument(
        "--graceful",
        action="store_true",
        help="member 1 leaves cleanly instead of being SIGKILLed: only moves between live members",
    )
    args = parser.parse_args()
    script = tuple(replace(s, action="leave") if args.graceful and s.action == "kill" else s for s in SCRIPT)
    print(machine())
    lost = False
    with world(args.workdir) as w:
        for n in range(1, args.rounds + 1):
            load_before = os.getloadavg()[0]
            scores = run(
                w,
                args.variants.split(","),
                seconds=args.seconds,
                rate=args.rate,
                keys=args.keys,
                script=script,
                tag="" if n == 1 else f"r{n}",
            )
            lost = lost or any(s.lost for s in scores)
            print()
            load = f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
            steps = "; ".join(f"{s.at:.0%} {s.action} {s.member}" for s in script)
            print(f"round {n}: {load}; members 0, 1, 2 from the start; {steps}")
            print("each step began and ended (s after the producer started): " + "; ".join(scores[0].events))
            print()
            print(scores_table(scores))
            print()
            print(cost_table(scores))
            print()
            print(
                "the trace of the moves, medians in ms (a sidecar's steps from its receipt of a generation):"
            )
            print(trace_table(scores))
            sys.stdout.flush()
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
