"""``mqbalance drain``: a preStop hook for the sidecar container.

Kubernetes sends SIGTERM to every container of a terminating pod at once, after its preStop
hook. The hook keeps the sidecar serving until the pod's application has released its
queues and the operator has handed them over (``GET /v1/drain``), so a rolling restart hands
queues over instead of dropping them. It always exits 0: a hook that fails only delays the
shutdown Kubernetes is carrying out anyway.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mqbalance.sidecar.client import SidecarClient, SidecarError
from mqbalance.sidecar.config import DEFAULT_PORT


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="mqbalance drain", description="Wait until this pod's sidecar has nothing left to hand over."
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"the sidecar's API port ({DEFAULT_PORT})"
    )
    parser.add_argument("--group", help="the ConsumerGroup, if the sidecar serves several")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait at most (default 30)")
    args = parser.parse_args(list(argv))
    client = SidecarClient(f"http://127.0.0.1:{args.port}", group=args.group)
    try:
        answer = client.drain(args.timeout)
    except SidecarError as e:
        print(f"mqbalance drain: {e}", file=sys.stderr)
        return 0
    state = "drained" if answer.get("drained") else f"not drained after {args.timeout:g} s"
    print(f"mqbalance drain: group {answer.get('group')}: {state} (generation {answer.get('generation')})")
    return 0
