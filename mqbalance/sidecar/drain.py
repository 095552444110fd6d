"""``mqbalance drain``: a preStop hook for the sidecar container.

Kubernetes sends SIGTERM to every container of a terminating pod at once, after its preStop
hook. The hook keeps the sidecar serving until the pod's application has released its
queues and the operator has handed them over (``GET /v1/drain``), so a rolling restart hands
queues over instead of dropping them. It always exits 0: a hook that fails only delays the
shutdown Kubernetes is carrying out anyway.

A sidecar serving several groups is drained group by group, within the one timeout: the hook
runs in the sidecar's container, whose ``MQBALANCE_GROUP`` names them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence

from mqbalance.sidecar.client import SidecarClient, SidecarError
from mqbalance.sidecar.config import DEFAULT_PORT, env_groups


def main(argv: Sequence[str], env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(
        prog="mqbalance drain", description="Wait until this pod's sidecar has nothing left to hand over."
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"the sidecar's API port ({DEFAULT_PORT})"
    )
    parser.add_argument(
        "--group", help="drain this ConsumerGroup only (default: every group MQBALANCE_GROUP names)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait at most (default 30)")
    args = parser.parse_args(list(argv))
    groups: list[str | None] = list(env_groups(env))
    if args.group:
        groups = [args.group]
    elif len(groups) < 2:
        groups = [None]  # the sidecar's only group: no ?group= needed
    deadline = time.monotonic() + args.timeout
    for group in groups:
        client = SidecarClient(f"http://127.0.0.1:{args.port}", group=group)
        try:
            answer = client.drain(max(0.0, deadline - time.monotonic()))
        except SidecarError as e:
            print(f"mqbalance drain: {e}", file=sys.stderr)
            continue
        state = "drained" if answer.get("drained") else f"not drained after {args.timeout:g} s"
        generation = answer.get("generation")
        print(f"mqbalance drain: group {answer.get('group')}: {state} (generation {generation})")
    return 0
