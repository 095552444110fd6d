"""Sidecar throughput and p99 beside a bare aiohttp handler, measured in the same run.

    python bench/bench_sidecar.py [--duration 5] [--connections 32] [--rounds 3]

Needs ``wrk`` (Debian: ``apt-get install wrk``). Each server runs alone in its own
process on loopback; wrk drives one at a time, alternating sidecar and bare
handler for ``--rounds`` rounds, and the median round is reported. The bare
handler returns bytes of the same size as the sidecar's answer (for POST it reads
the body first), so the ratio is the cost of the sidecar's routing, middleware
and work over aiohttp's floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from aiohttp import web

POD = "orders-7f9c-pod03"
TOPICS = 2
BROKERS = 4
QUEUES_PER_BROKER = 16
MEMBERS = 8


def _document() -> object:
    from mqbalance.contract import AssignmentDocument
    from mqbalance.model import MessageModel, MessageQueue

    members = [f"orders-7f9c-pod{i:02d}" for i in range(MEMBERS)]
    topics = {}
    for t in range(TOPICS):
        topic = f"orders-{t}"
        queues = [
            MessageQueue(topic, f"broker-{b}", q) for b in range(BROKERS) for q in range(QUEUES_PER_BROKER)
        ]
        topics[topic] = {m: tuple(queues[i :: len(members)]) for i, m in enumerate(members)}
    return AssignmentDocument(
        group="orders-consumer",
        generation=42,
        strategy="STICKY",
        message_model=MessageModel.CLUSTERING,
        computed_at=time.time(),
        reason="member-joined",
        members={m: "zone-a" for m in members},
        topics=topics,
    )


def sidecar_app() -> web.Application:
    from mqbalance.model import Broker, TopicRoute
    from mqbalance.sidecar.app import STATE, create_app
    from mqbalance.sidecar.config import SidecarConfig

    config = SidecarConfig(pod_name=POD, namespace="bench", groups=("orders",))
    app = create_app(config, source=None)
    state = app[STATE]
    state.publish("orders", _document())  # type: ignore[arg-type]
    brokers = tuple(Broker(f"broker-{b}", QUEUES_PER_BROKER, QUEUES_PER_BROKER) for b in range(BROKERS))
    state.put_route("orders-0", TopicRoute("orders-0", brokers))
    freeze_heap()
    return app


def freeze_heap() -> None:
    from mqbalance.sidecar.main import freeze_heap as freeze

    freeze()


def bare_app(queues_size: int, select_size: int) -> web.Application:
    queues_body = json.dumps({"pad": "x" * (queues_size - 11)}).encode()
    select_body = json.dumps({"pad": "x" * (select_size - 11)}).encode()
    assert len(queues_body) == queues_size
    assert len(select_body) == select_size

    async def queues(request: web.Request) -> web.Response:
        return web.Response(body=queues_body, content_type="application/json")

    async def select(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=select_body, content_type="application/json")

    app = web.Application()
    freeze_heap()  # as the sidecar does, so both pay the same garbage collector
    app.router.add_get("/v1/queues", queues)
    app.router.add_post("/v1/topics/{topic}/select", select)
    return app


def serve(kind: str, port: int, sizes: tuple[int, int]) -> None:
    if kind == "bare":
        web.run_app(bare_app(*sizes), host="127.0.0.1", port=port, access_log=None, print=None)
        return
    asyncio.run(serve_sidecar(port))


async def serve_sidecar(port: int) -> None:
    """The sidecar's application behind its listener (mqbalance/listener.py), as the product serves it."""
    from mqbalance import listener
    from mqbalance.sidecar.config import API_LIMITS

    app_runner = listener.runner(sidecar_app(), API_LIMITS)
    await app_runner.setup()
    await listener.Site(app_runner, ["127.0.0.1"], port).start()
    await asyncio.Event().wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(kind: str, sizes: tuple[int, int]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(port), *map(str, sizes)])
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/queues", timeout=1).read()
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"the {kind} server did not start") from None
            time.sleep(0.1)


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def wrk(url: str, duration: int, connections: int, script: Path | None) -> tuple[float, float]:
    """(requests/second, p99 seconds) from one wrk run."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency"]
    if script is not None:
        argv += ["-s", str(script)]
    out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"99%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk saw errors against {url}:\n{out}")
    return rps, float(value) * _UNITS[unit]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]), (int(sys.argv[4]), int(sys.argv[5])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed; on Debian: apt-get install wrk", file=sys.stderr)
        return 2

    load_before = os.getloadavg()[0]
    sidecar, sidecar_port = start("sidecar", (0, 0))
    try:
        base = f"http://127.0.0.1:{sidecar_port}"
        queues_size = len(urllib.request.urlopen(f"{base}/v1/queues").read())
        req = urllib.request.Request(f"{base}/v1/topics/orders-0/select", data=b"{}", method="POST")
        req.add_header("Content-Type", "application/json")
        select_size = len(urllib.request.urlopen(req).read())
    except BaseException:
        sidecar.kill()
        raise
    bare, bare_port = start("bare", (queues_size, select_size))
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        post = Path(tmp) / "post.lua"
        post.write_text(
            'wrk.method = "POST"\nwrk.body = "{}"\nwrk.headers["Content-Type"] = "application/json"\n'
        )
        endpoints = [
            ("GET /v1/queues", "/v1/queues", None),
            ("POST /v1/topics/{t}/select", "/v1/topics/orders-0/select", post),
        ]
        try:
            servers = [("sidecar", sidecar_port), ("bare", bare_port)]
            for round_no in range(args.rounds):
                for name, path, script in endpoints:
                    # Who goes first alternates, so a drift in machine load favours neither.
                    for kind, port in servers if round_no % 2 == 0 else servers[::-1]:
                        got = wrk(f"http://127.0.0.1:{port}{path}", args.duration, args.connections, script)
                        results.setdefault((name, kind), []).append(got)
        finally:
            for proc in (sidecar, bare):
                proc.terminate()
                proc.wait()

    print(
        f"wrk -t1 -c{args.connections} -d{args.duration}s, median of {args.rounds} alternating rounds; "
        f"body sizes: queues {queues_size} B, select {select_size} B; "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} CPUs"
    )
    print("| endpoint | sidecar req/s | bare req/s | ratio | sidecar p99 ms | bare p99 ms | p99 ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, _, _ in endpoints:
        s_rps = statistics.median(r for r, _ in results[(name, "sidecar")])
        b_rps = statistics.median(r for r, _ in results[(name, "bare")])
        s_p99 = statistics.median(p for _, p in results[(name, "sidecar")])
        b_p99 = statistics.median(p for _, p in results[(name, "bare")])
        print(
            f"| {name} | {s_rps:,.0f} | {b_rps:,.0f} | {s_rps / b_rps:.2f}x | "
            f"{s_p99 * 1e3:.2f} | {b_p99 * 1e3:.2f} | {s_p99 / b_p99:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
