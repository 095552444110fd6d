"""``mqbalance operator``: run the operator (kopf) against the current cluster."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from mqbalance.listener_limits import add_arguments, limits_from, parse_hosts
from mqbalance.operator.settings import DEFAULT_PROGRESS_DEADLINE, OperatorConfig
from mqbalance.rocketmq.nameserver import parse_addresses


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
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        help="address of /metrics and /healthz, several separated by commas (default all; the chart gives "
        "the pod's IP and 127.0.0.1)",
    )
    parser.add_argument(
        "--journal", metavar="PATH", help="append rebalance journal lines here (default stdout)"
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
        "--shards",
        type=int,
        default=1,
        metavar="N",
        help="with --leader-election: split the groups into N shards held by the running replicas through "
        "Leases LEASE-0 .. LEASE-(N-1), so every replica works (default 1: one leader, standbys)",
    )
    parser.add_argument(
        "--shard-by",
        choices=["group", "namespace"],
        default="group",
        help="with --shards: hash each group into a shard, or each namespace, so that a replica lists and "
        "watches only the namespaces of its shards (for fleets of many namespaces; default group)",
    )
    parser.add_argument(
        "--workers", type=int, default=8, metavar="N", help="groups reconciled at once (default 8)"
    )
    parser.add_argument(
        "--progress-deadline",
        type=float,
        default=DEFAULT_PROGRESS_DEADLINE,
        metavar="SECONDS",
        help="/healthz fails when keys have waited this long with no reconcile started or finished "
        f"(default {DEFAULT_PROGRESS_DEADLINE:g})",
    )
    parser.add_argument(
        "--name-server",
        metavar="ADDRS",
        default=os.environ.get("NAMESRV_ADDR") or None,
        help="RocketMQ NameServer(s), host:port separated by ';', for Topics whose spec.nameServer "
        "gives no addresses (default: $NAMESRV_ADDR, as RocketMQ's clients)",
    )
    parser.add_argument(
        "--name-server-timeout",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="time for one route request to one NameServer (default 3, the Java client's)",
    )
    parser.add_argument(
        "--lag-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="read every group's offsets from its brokers this often, for status.lag and the lag metrics; "
        "0 turns it off (default 30)",
    )
    parser.add_argument(
        "--lag-timeout",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="time for one offset request to one broker (default 3)",
    )
    parser.add_argument(
        "--lag-requests-per-second",
        type=float,
        default=50.0,
        metavar="N",
        help="offset requests to brokers a second at most, over every group (default 50)",
    )
    parser.add_argument(
        "--lag-queue-metrics",
        action="store_true",
        help="also export mqbalance_queue_lag, one series per queue of every group (many series)",
    )
    parser.add_argument(
        "--lag-drain-seconds",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="status.lag.recommendedMembers counts the members that consume the backlog within this time "
        "besides keeping up with what arrives (default 300)",
    )
    parser.add_argument(
        "--external-metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve external.metrics.k8s.io/v1beta1 (lag, recommended members) over HTTPS on this port for a "
        "HorizontalPodAutoscaler, through an APIService; 0 (default) serves nothing",
    )
    parser.add_argument(
        "--external-metrics-host",
        default="0.0.0.0",
        help="address of the external metrics listener, several separated by commas (default all; the chart "
        "gives the pod's IP)",
    )
    parser.add_argument(
        "--external-metrics-cert-dir",
        metavar="DIR",
        help="tls.crt and tls.key of the external metrics listener (the APIService's caBundle signs tls.crt)",
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
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    if not 0 < args.metrics_port < 65536:
        parser.error(f"--metrics-port {args.metrics_port} is not a TCP port; use 1-65535")
    if args.debounce_override is not None and args.debounce_override < 0:
        parser.error("--debounce-override must be 0 or more seconds")
    lease_namespace = (
        args.lease_namespace or os.environ.get("POD_NAMESPACE") or next(iter(args.namespace), None)
    )
    if args.leader_election:
        if not lease_namespace:
            parser.error(
                "--leader-election needs --lease-namespace (or $POD_NAMESPACE) with --all-namespaces"
            )
        if args.lease_duration < 3:
            parser.error("--lease-duration must be at least 3 seconds")
    if not 1 <= args.shards <= 1024:
        parser.error("--shards must be from 1 to 1024")
    if args.shards > 1 and not args.leader_election:
        parser.error("--shards needs --leader-election LEASE: the shards are Leases named after it")
    if args.shard_by != "group" and args.shards == 1:
        parser.error("--shard-by needs --shards N (N > 1)")
    if not 1 <= args.workers <= 256:
        parser.error("--workers must be from 1 to 256")
    if not 30 <= args.progress_deadline <= 86400:
        parser.error("--progress-deadline must be from 30 to 86400 seconds")
    if args.name_server:
        try:
            parse_addresses(args.name_server)
        except ValueError as e:
            parser.error(f"--name-server: {e}")
    if args.lag_interval != 0 and not 1 <= args.lag_interval <= 3600:
        parser.error("--lag-interval must be 0 (off) or from 1 to 3600 seconds")
    if not 0 < args.lag_timeout <= 60:
        parser.error("--lag-timeout must be more than 0 and at most 60 seconds")
    if not 0 < args.lag_requests_per_second <= 10000:
        parser.error("--lag-requests-per-second must be more than 0 and at most 10000")
    if not 1 <= args.lag_drain_seconds <= 86400:
        parser.error("--lag-drain-seconds must be from 1 to 86400")
    if not 0 <= args.external_metrics_port < 65536:
        parser.error(f"--external-metrics-port {args.external_metrics_port} is not a TCP port; use 1-65535")
    if args.external_metrics_port and not args.external_metrics_cert_dir:
        parser.error("--external-metrics-port needs --external-metrics-cert-dir (tls.crt, tls.key)")
    if not 0 < args.name_server_timeout <= 60:
        parser.error("--name-server-timeout must be more than 0 and at most 60 seconds")
    try:
        limits = limits_from(args)
        parse_hosts(args.metrics_host, "--metrics-host")
        parse_hosts(args.external_metrics_host, "--external-metrics-host")
    except ValueError as e:
        parser.error(str(e))
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
        leader_election=args.leader_election,
        lease_namespace=lease_namespace,
        lease_duration=args.lease_duration,
        shards=args.shards,
        shard_by=args.shard_by,
        workers=args.workers,
        progress_deadline=args.progress_deadline,
        kubeconfig=args.kubeconfig,
        debounce_override=args.debounce_override,
        name_server=args.name_server,
        name_server_timeout=args.name_server_timeout,
        lag_interval=args.lag_interval,
        lag_timeout=args.lag_timeout,
        lag_rate=args.lag_requests_per_second,
        lag_queue_metrics=args.lag_queue_metrics,
        lag_drain_seconds=args.lag_drain_seconds,
        external_metrics_port=args.external_metrics_port,
        external_metrics_host=args.external_metrics_host,
        external_metrics_cert_dir=args.external_metrics_cert_dir,
        limits=limits,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    if config.kubeconfig:
        # kopf's own login reads $KUBECONFIG; both then use the same credentials.
        os.environ["KUBECONFIG"] = config.kubeconfig
    from mqbalance.operator.runtime import run_with_kopf

    try:
        return asyncio.run(run_with_kopf(config))
    except KeyboardInterrupt:
        return 130
