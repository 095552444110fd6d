"""``mqbalance sidecar``: serve the API and the metrics until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence

from mqbalance import listener
from mqbalance.kube import KubeClient
from mqbalance.listener import parse_hosts
from mqbalance.sidecar.acks import AckRecorder
from mqbalance.sidecar.app import SOURCE_TASK, STATE, create_app, create_metrics_app
from mqbalance.sidecar.config import ConfigError, SidecarConfig, parse_config
from mqbalance.sidecar.watch import AssignmentSource, FilesSource, KubernetesSource, MemberLease

log = logging.getLogger("mqbalance.sidecar")


async def serve(config: SidecarConfig) -> int:
    kube: KubeClient | None = None
    source: AssignmentSource
    recorder: AckRecorder | None = None
    if config.uses_api:
        try:
            kube = await KubeClient.connect(config.kubeconfig)
        except Exception as e:  # the loaders raise several types; all mean "cannot reach the API"
            log.error("cannot configure the Kubernetes client: %s", e)
            return 1
        source = KubernetesSource(
            kube,
            config.namespace,
            list(config.groups),
            files=config.assignment_files,
            watch_topics=config.watch_topics,
            file_interval=config.file_poll_interval,
            # Time-bounded grants (handover Release, Orderly): renewed only while a document has a lease.
            member_lease=MemberLease(
                kube,
                config.namespace,
                config.pod_name,
                config.pod_uid,
                groups=tuple(g for g in config.groups if g not in config.assignment_files),
            ),
        )
        recorder = AckRecorder(kube, config.namespace, config.pod_name)
    else:
        source = FilesSource(config.assignment_files, config.file_poll_interval)
    app = create_app(config, source=source, recorder=recorder)
    runners = [listener.runner(app, config.limits)]
    sites = [(runners[0], parse_hosts(config.host), config.port)]
    if config.metrics_port:
        runners.append(listener.runner(create_metrics_app(app[STATE]), config.metrics_limits))
        sites.append((runners[1], parse_hosts(config.metrics_host), config.metrics_port))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for runner in runners:
            await runner.setup()
        freeze_heap()
        for runner, hosts, port in sites:
            await listener.Site(runner, hosts, port).start()
            log.info("listening on %s port %d", ", ".join(hosts), port)
        source_task = app[SOURCE_TASK]
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({stopped, source_task}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if source_task.done() and not source_task.cancelled() and source_task.exception() is not None:
            log.error("the assignment source stopped: %r", source_task.exception())
            return 1
        return 0
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        if kube is not None:
            await kube.close()


def freeze_heap() -> None:
    """Move everything allocated at start-up out of the garbage collector's sight.

    The imports (kubernetes, prometheus_client, aiohttp) leave a large, permanent
    heap; a full collection walking it shows up as request latency spikes.
    """
    gc.collect()
    gc.freeze()


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(
        level=os.environ.get("MQBALANCE_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = parse_config(argv, os.environ)
    except ConfigError as e:
        print(f"mqbalance sidecar: {e}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(serve(config))
    return 130
