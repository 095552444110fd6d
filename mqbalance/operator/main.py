"""``mqbalance operator``: run the operator (kopf) against the current cluster."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence

from mqbalance.operator.settings import OperatorConfig

RESTARTS = 5
RESTART_DELAY = 2.0


def parse_args(argv: Sequence[str]) -> OperatorConfig:
    parser = argparse.ArgumentParser(
        prog="mqbalance operator",
        description="Assign RocketMQ queues to the pods of every ConsumerGroup and publish the assignments.",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="serve this namespace (repeatable)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace")
    parser.add_argument(
        "--metrics-port", type=int, default=8080, help="port of /metrics and /healthz (default 8080)"
    )
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address to serve metrics on (default all)")
    parser.add_argument(
        "--journal", metavar="PATH", help="append rebalance journal lines here (default stdout)"
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        help="coordinate with other operator replicas through this kopf peering object",
    )
    parser.add_argument(
        "--leader-election",
        metavar="LEASE",
        help="run only while holding this coordination.k8s.io Lease (replicas stand by until it expires)",
    )
    parser.add_argument(
        "--lease-namespace",
        metavar="NS",
        help="namespace of the Lease (default: $POD_NAMESPACE, else the first --namespace)",
    )
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how long a Lease not renewed stays valid; a standby takes over after it (default 15)",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)"
    )
    parser.add_argument(
        "--debounce-override",
        type=float,
        metavar="SECONDS",
        help="use this debounce window for every group instead of its spec.debounceSeconds",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(list(argv))
    if not 0 < args.metrics_port < 65536:
        parser.error(f"--metrics-port {args.metrics_port} is not a TCP port; use 1-65535")
    if args.debounce_override is not None and args.debounce_override < 0:
        parser.error("--debounce-override must be 0 or more seconds")
    lease_namespace = (
        args.lease_namespace or os.environ.get("POD_NAMESPACE") or next(iter(args.namespace), None)
    )
    if args.leader_election:
        if args.peering:
            parser.error("use either --leader-election or --peering, not both")
        if not lease_namespace:
            parser.error(
                "--leader-election needs --lease-namespace (or $POD_NAMESPACE) with --all-namespaces"
            )
        if args.lease_duration < 3:
            parser.error("--lease-duration must be at least 3 seconds")
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.log_level != "DEBUG":
        # kopf logs every handled event at INFO; our own logs say what matters.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    return OperatorConfig(
        namespaces=tuple(args.namespace),
        all_namespaces=args.all_namespaces,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        journal=args.journal,
        peering=args.peering,
        leader_election=args.leader_election,
        lease_namespace=lease_namespace,
        lease_duration=args.lease_duration,
        kubeconfig=args.kubeconfig,
        debounce_override=args.debounce_override,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    if config.kubeconfig:
        # kopf's own login reads $KUBECONFIG; both clients then use the same credentials.
        os.environ["KUBECONFIG"] = config.kubeconfig
    import kopf

    from mqbalance.operator import handlers  # noqa: F401  (registers the handlers)

    try:
        if config.leader_election:
            return asyncio.run(run_elected(config))
        # A restarted API server can answer 404 for custom resources until it has loaded the CRDs;
        # kopf treats that as fatal and stops. Start it again (a fresh state, as after a crash).
        from kopf._cogs.clients.errors import APIError

        for attempt in range(1, RESTARTS + 1):
            try:
                kopf.run(
                    standalone=config.peering is None,
                    peering_name=config.peering,
                    clusterwide=config.all_namespaces,
                    namespaces=config.namespaces,
                    memo=kopf.Memo(config=config),
                )
                return 0
            except APIError as e:
                if attempt == RESTARTS:
                    raise
                logging.getLogger("mqbalance.operator").warning(
                    "kopf stopped on an API error (%s); restarting the operator in %g s", e, RESTART_DELAY
                )
                time.sleep(RESTART_DELAY)
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:
        return 1
    return 0


async def run_elected(config: OperatorConfig) -> int:
    """Stand by until this replica holds the Lease, then operate until stopped or the Lease is lost.

    Losing the Lease ends the process (exit 1): the pod restarts as a standby with a clean state,
    as controller-runtime's managers do. While standing by only /healthz is served.
    """
    import kopf
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from mqbalance.operator.kubeapi import KubeApi, load_client
    from mqbalance.operator.leader import LeaseElector, default_identity
    from mqbalance.operator.metrics import create_app, serve

    if not (config.leader_election and config.lease_namespace):
        raise ValueError("leader election needs a Lease name and namespace")
    api = KubeApi(load_client(config.kubeconfig), workers=2)
    elector = LeaseElector(
        api, config.lease_namespace, config.leader_election, default_identity(), config.lease_duration
    )
    runner = await serve(
        create_app(CollectorRegistry(), lambda: {"standby": True, "groups": 0}),
        config.metrics_port,
        config.metrics_host,
    )
    standby: web.AppRunner | None = runner
    try:
        await elector.acquire()
        await runner.cleanup()
        standby = None
        operator = asyncio.create_task(
            kopf.operator(
                standalone=True,
                clusterwide=config.all_namespaces,
                namespaces=config.namespaces,
                memo=kopf.Memo(config=config),
            )
        )
        lost = asyncio.create_task(elector.hold())
        done, _ = await asyncio.wait({operator, lost}, return_when=asyncio.FIRST_COMPLETED)
        if lost in done:
            operator.cancel()
            await asyncio.gather(operator, return_exceptions=True)
            return 1
        lost.cancel()
        await elector.release()
        operator.result()
        return 0
    finally:
        if standby is not None:
            await standby.cleanup()
        api.close()
