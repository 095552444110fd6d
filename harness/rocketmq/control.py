"""A real RocketMQ that another process drives over stdin: the Java tests of master-slave pairs.

``python -m harness.rocketmq.control --slave broker-a`` starts a NameServer and the brokers (the
named ones with a slave each), prints one JSON line::

    {"namesrv": "127.0.0.1:PORT", "masters": {"broker-a": "127.0.0.1:PORT"},
     "slaves": {"broker-a": "127.0.0.1:PORT"}, "logs": "DIR"}

then reads one JSON array a line from stdin and answers each with one JSON line, ``{"ok": ...}``
or ``{"error": "..."}``:

    ["topic", NAME, QUEUES]                  create NAME on every broker (and slave); ok: true
    ["static-topic", NAME, QUEUES]           a 5.x static topic of QUEUES logical queues; ok: true
    ["stop-master", BROKER]                  SIGKILL the master once its slave caught up; ok: true
    ["start-master", BROKER]                 start it again on its ports and store; ok: true
    ["offset", ROLE, BROKER, GROUP, TOPIC, QUEUE_ID]   ROLE master or slave; ok: the stored offset, -1 none

Everything stops when stdin closes (the JVM exited) or on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from harness.rocketmq.releases import DEFAULT_VERSION, RocketMQError
from harness.rocketmq.server import RocketMQ


def _answer(mq: RocketMQ, command: list[object]) -> object:
    verb, *args = command
    if verb == "topic":
        mq.create_topic(str(args[0]), int(str(args[1])))
        return True
    if verb == "static-topic":
        mq.create_static_topic(str(args[0]), int(str(args[1])))
        return True
    if verb == "stop-master":
        mq.stop_master(str(args[0]))
        return True
    if verb == "start-master":
        mq.start_master(str(args[0]))
        return True
    if verb == "offset":
        role, broker, group, topic, queue_id = (str(a) for a in args)
        address = mq.slave_addr(broker) if role == "slave" else mq.broker_addr(broker)
        return mq.consumer_offset(address, group, topic, int(queue_id))
    raise ValueError(f"unknown command {verb!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.rocketmq.control", description=__doc__)
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--broker", action="append", default=[], help="broker names (default: broker-a)")
    parser.add_argument("--slave", action="append", default=[], help="a broker that also gets a slave")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="every broker's")
    args = parser.parse_args(argv)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        sys.stdin.close()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    config = dict(c.split("=", 1) for c in args.config)
    brokers = args.broker or ["broker-a"]
    with RocketMQ(args.version, brokers=brokers, slaves=args.slave, broker_config=config) as mq:
        ready = {
            "namesrv": mq.namesrv_addr,
            "masters": {b: mq.broker_addr(b) for b in brokers},
            "slaves": {b: mq.slave_addr(b) for b in args.slave},
            "logs": str(mq.workdir / "logs"),
        }
        print(json.dumps(ready), flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                reply: dict[str, object] = {"ok": _answer(mq, json.loads(line))}
            except (RocketMQError, ValueError, KeyError, IndexError, OSError) as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
