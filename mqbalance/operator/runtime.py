"""The operator's parts wired together and run: the client, the informers, the controller and its
workers, the Event poster, the metrics endpoint, and leader election.

kopf runs the process: ``mqbalance operator`` is ``kopf.run``, whose start-up handler starts a
:class:`Runtime` and whose clean-up handler stops it, and kopf handles the signals. kopf
watches nothing: per-object handlers, daemons and finalizers cost a task, a batching window
and writes per object, which at thousands of groups outweigh everything else the operator
does (docs/architecture.md). The informers here watch ConsumerGroups, Topics, Pods, Nodes, the
assignment ConfigMaps and the sidecars' member Leases into caches, and a keyed work queue does the rest, as
controller-runtime does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from mqbalance.contract import (
    API_PATH,
    CONSUMER_GROUPS,
    GROUP_LABEL,
    MANAGED_BY,
    MEMBER_LEASE_LABEL,
    OFFSET_RESETS,
    TOPICS,
)
from mqbalance.kube import Informer, KubeClient, LeaseElector, LeaseLock, LeaseLoop, compact, default_identity
from mqbalance.operator import external_metrics
from mqbalance.operator.broker_locks import BrokerLocks
from mqbalance.operator.controller import Controller
from mqbalance.operator.journal import Journal
from mqbalance.operator.lagpoll import LagPoller, LagSettings
from mqbalance.operator.leases import LeaseTable, lease_record
from mqbalance.operator.membership import pod_info
from mqbalance.operator.metrics import Leadership, OperatorMetrics, create_app, serve
from mqbalance.operator.nameserver import RouteReader
from mqbalance.operator.offsets import OffsetReader
from mqbalance.operator.scopes import NamespaceScopes
from mqbalance.operator.settings import OperatorConfig
from mqbalance.operator.shards import ShardChanges, Shards, ShardSetCheck, run_shards
from mqbalance.operator.world import World
from mqbalance.operator.writes import Writer

logger = logging.getLogger("mqbalance.operator")

CONFIGMAP_SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{GROUP_LABEL}"
CONFIGMAP_FIELDS = ("namespace", "name", "resourceVersion", "labels", "annotations")
TOPIC_STATUS_FIELDS = (
    "observedGeneration",
    "brokers",
    "readableQueues",
    "writableQueues",
    "route",
    "conditions",
)


class Runtime:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.exit_code = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._workers: list[asyncio.Task[None]] = []
        self._http: web.AppRunner | None = None
        self._external: web.AppRunner | None = None
        self._client: KubeClient | None = None
        self._lock: LeaseLock | None = None
        self._shards: Shards | None = None
        self._leases: LeaseLoop | None = None
        """With leader election: where the Leases are renewed, never behind the reconciles (lease_loop.py)."""
        self._scopes: NamespaceScopes | None = None
        self.controller: Controller | None = None
        self.lag: LagPoller | None = None
        self.standby = bool(config.leader_election) and config.shards == 1

    async def start(self, stop: asyncio.Event) -> None:
        """Serve /healthz and /metrics at once, then (once elected, if electing) operate.

        ``stop`` is set when the process should end: the Lease was lost.
        """
        config = self.config
        self._client = client = await KubeClient.connect(config.kubeconfig, requests=config.max_requests)
        registry = CollectorRegistry()
        writer = Writer(client)
        metrics = OperatorMetrics(
            registry,
            lambda: self.controller.world.gauges() if self.controller else [],
            self.leadership,
            lambda: self.controller.world.lag_gauges() if self.controller else [],
        )
        writer.on_event_dropped = metrics.events_dropped.inc
        self.controller = Controller(
            writer,
            metrics,
            Journal(config.journal),
            debounce_override=config.debounce_override,
            routes=RouteReader(config.name_server, config.name_server_timeout),
        )
        self._http = await serve(
            create_app(registry, self._health), config.metrics_port, config.metrics_host, config.limits
        )
        logger.info("metrics and /healthz on %s port %d", config.metrics_host, config.metrics_port)
        if config.external_metrics_port and config.external_metrics_cert_dir:
            # Every replica, standbys too: it reads the groups' status from the API server.
            self._external = await external_metrics.serve(
                client,
                config.external_metrics_host,
                config.external_metrics_port,
                config.external_metrics_cert_dir,
                config.limits,
            )
        self._tasks.append(asyncio.create_task(self._run(client, writer, stop), name="operator"))

    async def _run(self, client: KubeClient, writer: Writer, stop: asyncio.Event) -> None:
        config, controller = self.config, self.controller
        assert controller is not None
        elector: LeaseElector | None = None
        scopes: NamespaceScopes | None = None
        if config.leader_election and config.lease_namespace:
            leases = self._leases = LeaseLoop()
            lease = (await leases.start(config.kubeconfig), config.lease_namespace, config.leader_election)
            if config.shards > 1:
                scopes = self._start_shards(leases, lease, client)
            else:
                elector = await self._elect(leases, lease)
        if scopes is None:
            informers = create_informers(client, controller.world, config)
        else:
            informers = [Informer(client, "/api/v1/nodes", node_labels, controller.world.on_node)]
            if config.all_namespaces:
                informers.append(Informer(client, "/api/v1/namespaces", _present, scopes.on_namespace))
            else:
                scopes.set_known(config.namespaces)
        # OffsetResets read their brokers as the lag loop does, with its timeout and Secrets.
        controller.reset_reconciler.reader = OffsetReader(
            config.name_server,
            config.lag_timeout,
            secrets=lambda namespace, name: client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}"),
        )
        # A stopped member's broker locks are released through the same brokers (handover Orderly).
        controller.group_reconciler.locks = BrokerLocks(
            controller.reset_reconciler.reader, controller.metrics
        )
        tasks = [asyncio.create_task(i.run(), name=f"informer {i.path}") for i in informers]
        tasks.append(asyncio.create_task(wait_synced(controller.world, informers), name="synced"))
        self._workers = [
            asyncio.create_task(controller.run_worker(), name="worker") for _ in range(config.workers)
        ]
        tasks += self._workers
        tasks.append(asyncio.create_task(writer.run_event_poster(), name="events"))
        if config.lag_interval > 0:  # its own loop: never on a reconcile's path
            reader = OffsetReader(
                config.name_server,
                config.lag_timeout,
                config.lag_rate,
                secrets=lambda namespace, name: client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}"),
            )
            self.lag = LagPoller(
                controller.world,
                reader,
                LagSettings(
                    config.lag_interval, config.lag_queue_metrics, drain_seconds=config.lag_drain_seconds
                ),
                controller.metrics,
                controller.owns,
            )
            tasks.append(asyncio.create_task(self.lag.run(), name="lag"))
        self._tasks += tasks
        if elector is not None:
            assert self._leases is not None
            await self._leases.run(elector.hold())
            # Lost: stop at once, as controller-runtime's managers do; the pod restarts as a standby.
            self.exit_code = 1
            stop.set()

    def _start_shards(
        self, leases: LeaseLoop, lease: tuple[KubeClient, str, str], client: KubeClient
    ) -> NamespaceScopes | None:
        """Every replica works, on the shards it holds (shards.py); the scopes when sharded by namespace.

        ``lease``: the Lease thread's client, the Leases' namespace and their name prefix."""
        config, controller = self.config, self.controller
        assert controller is not None
        scopes: NamespaceScopes | None = None
        shards = self._shards = Shards(
            *lease,
            default_identity(),
            config.shards,
            config.lease_duration,
            by=config.shard_by,
        )
        controller.owns = shards.owns
        if config.shard_by == "namespace":
            scopes = self._scopes = NamespaceScopes(
                controller.world,
                lambda scope: namespace_informers(client, controller.world, scope),
                lambda ns: shards.shard(ns, "") in shards.owned,
            )

        def busy(shard: int) -> bool:  # on the Lease thread; active() copies the keys in one step
            return any(shards.shard(ns, name) == shard for _, ns, name in controller.queue.active())

        def changed(step: ShardChanges) -> None:  # on this loop
            if scopes is not None:
                scopes.update()  # a namespace's groups are worked on once it is listed
            if step.gained or step.retry:
                controller.world.resync(
                    lambda ns, name: shards.shard(ns, name) in step.gained or (ns, name) in step.retry
                )

        loop = asyncio.get_running_loop()

        def changed_there(step: ShardChanges) -> None:  # on the Lease thread
            loop.call_soon_threadsafe(changed, step)

        renewing = run_shards(shards, busy, changed_there)
        self._tasks.append(asyncio.create_task(leases.run(renewing), name="shards"))
        return scopes

    async def _elect(self, leases: LeaseLoop, lease: tuple[KubeClient, str, str]) -> LeaseElector:
        """Return once this replica leads (a single leader of one Lease); ``lease`` as for shards."""
        self._lock = LeaseLock(*lease, default_identity(), self.config.lease_duration)
        elector = LeaseElector(self._lock, ShardSetCheck(*lease))
        await leases.run(elector.acquire())
        self.standby = False
        return elector

    def leadership(self) -> Leadership:
        """This replica's part in leader election now (the metrics read it at every scrape)."""
        config = self.config
        lease = config.leader_election or ""
        if not (config.leader_election and config.lease_namespace):  # as _run decides
            return Leadership(lease, leader=True, shards=1, shards_held=1)
        if config.shards > 1:
            shards = self._shards
            held = sum(1 for i in shards.owned if shards.locks[i].held) if shards is not None else 0
            return Leadership(lease, leader=False, shards=config.shards, shards_held=held)
        leader = self._lock is not None and self._lock.held
        return Leadership(lease, leader=leader, shards=1, shards_held=int(leader))

    def _health(self) -> dict[str, Any]:
        """What /healthz answers; with ``problems`` it fails (the liveness probe restarts the pod)."""
        if self.standby:
            return {"standby": True, "groups": 0}
        health: dict[str, Any] = {"groups": len(self.controller.world.groups) if self.controller else 0}
        if self.controller is not None:
            queue = self.controller.queue
            health["work"] = {"queued": len(queue), "working": queue.busy, "later": queue.waiting}
            problems = self._stuck()
            if problems:
                logger.warning("/healthz fails: %s", "; ".join(problems))
                health["problems"] = problems
        if self._shards is not None:
            health["shards"] = sorted(self._shards.owned)
            health["members"] = list(self._shards.members)
            if self._shards.conflict:
                health["waiting"] = self._shards.conflict
        if self._scopes is not None:
            health["namespaces"] = self._scopes.watched
        return health

    def _stuck(self) -> list[str]:
        """Why the work loop cannot make progress: a worker ended (run_worker ends only when
        cancelled, so this is a bug), or keys waited the progress deadline with no key taken or
        finished (every worker is stuck in a reconcile). Judged once the caches are listed."""
        problems = []
        ended = [t for t in self._workers if t.done()]
        if ended:
            why = sorted({_ending(t) for t in ended})
            problems.append(f"{len(ended)} of {len(self._workers)} workers ended: {', '.join(why)}")
        controller = self.controller
        assert controller is not None
        stalled = controller.queue.stalled_for()
        deadline = self.config.progress_deadline
        if controller.world.synced.is_set() and stalled >= deadline:
            busy = ", ".join(" ".join((k[0], f"{k[1]}/{k[2]}")) for k in sorted(controller.queue.active()))
            problems.append(
                f"{len(controller.queue)} keys queued and none taken or finished for {stalled:.0f} s "
                f"(--progress-deadline {deadline:g}); {controller.queue.busy} busy: {busy}"
            )
        return problems

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        leases = self._leases
        if leases is not None and self._lock is not None and self._lock.held:
            await leases.run(self._lock.release())
        if self._scopes is not None:
            await self._scopes.stop_all()
        if leases is not None and self._shards is not None:
            await leases.run(self._shards.stop())
        if leases is not None:
            await leases.stop()
        if self._http is not None:
            await self._http.cleanup()
        if self._external is not None:
            await self._external.cleanup()
        if self.controller is not None:
            self.controller.journal.close()
        if self._client is not None:
            await self._client.close()


def _ending(task: asyncio.Task[None]) -> str:
    """How a task ended: cancelled, the exception's type, or returned."""
    if task.cancelled():
        return "cancelled"
    error = task.exception()
    return type(error).__name__ if error is not None else "returned"


def create_informers(client: KubeClient, world: World, config: OperatorConfig) -> list[Informer[Any]]:
    """ConsumerGroups, Topics, Pods and our ConfigMaps in every served namespace (or all), all Nodes."""
    scopes = [""] if config.all_namespaces else [f"/namespaces/{ns}" for ns in config.namespaces]
    informers: list[Informer[Any]] = [Informer(client, "/api/v1/nodes", node_labels, world.on_node)]
    for scope in scopes:
        informers += namespace_informers(client, world, scope)
    return informers


def namespace_informers(client: KubeClient, world: World, scope: str) -> list[Informer[Any]]:
    """ConsumerGroups, Topics, OffsetResets, Pods, our ConfigMaps and the member Leases under ``scope``
    (``/namespaces/<ns>``, or "": all)."""
    if world.leases is None:
        world.leases = LeaseTable()  # watched: a member without a Lease is judged as one
    return [
        Informer(client, f"{API_PATH}{scope}/{CONSUMER_GROUPS}", group_snapshot, world.on_group),
        Informer(client, f"{API_PATH}{scope}/{TOPICS}", topic_snapshot, world.on_topic),
        Informer(client, f"{API_PATH}{scope}/{OFFSET_RESETS}", reset_snapshot, world.on_reset),
        Informer(client, f"/api/v1{scope}/pods", pod_info, world.on_pod),
        Informer(
            client,
            f"/api/v1{scope}/configmaps",
            configmap_snapshot,
            world.on_configmap,
            label_selector=CONFIGMAP_SELECTOR,
        ),
        # Time-bounded ownership: when each member's sidecar last renewed (handover Release, Orderly).
        Informer(
            client,
            f"/apis/coordination.k8s.io/v1{scope}/leases",
            lease_record,
            world.on_lease,
            label_selector="=".join(MEMBER_LEASE_LABEL),
        ),
    ]


async def wait_synced(world: World, informers: list[Informer[Any]]) -> None:
    await asyncio.gather(*(informer.synced.wait() for informer in informers))
    world.synced.set()
    logger.info(
        "listed %d groups, %d topics, %d offset resets, %d pods, %d nodes, %d assignment ConfigMaps, "
        "%d member Leases; groups reconcile now",
        len(world.groups),
        len(world.topics),
        len(world.resets),
        len(world.pods),
        len(world.node_labels),
        len(world.configmaps),
        len(world.leases or ()),
    )


def _present(body: Mapping[str, Any]) -> bool:
    """A Namespace kept as nothing but its name (the informer's key)."""
    return True


def node_labels(body: Mapping[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = compact((body.get("metadata") or {}).get("labels") or {})
    return labels


def _meta(body: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {k: meta.get(k) for k in keys}


def group_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator keeps of a ConsumerGroup: what it reconciles from and what its writes need."""
    snapshot: dict[str, Any] = compact(
        {
            "kind": body.get("kind"),
            "metadata": _meta(body, "namespace", "name", "uid", "generation", "finalizers"),
            "spec": body.get("spec") or {},
            "status": body.get("status") or {},
        }
    )
    return snapshot


def reset_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator keeps of an OffsetReset, the approval annotation and the time it was made with it."""
    keys = ("namespace", "name", "uid", "generation", "annotations", "creationTimestamp")
    snapshot: dict[str, Any] = compact(
        {"metadata": _meta(body, *keys), "spec": body.get("spec") or {}, "status": body.get("status") or {}}
    )
    return snapshot


def topic_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    status = body.get("status") or {}
    snapshot: dict[str, Any] = compact(
        {
            "metadata": _meta(body, "namespace", "name", "uid", "generation"),  # uid: its Events
            "spec": body.get("spec") or {},
            # Only what the operator writes there: to tell whether it must write it again.
            "status": {k: status[k] for k in TOPIC_STATUS_FIELDS if k in status},
        }
    )
    return snapshot


def configmap_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a rewrite keeps (labels, annotations) and the data; not owners, managed fields, times."""
    meta = body.get("metadata") or {}
    snapshot: dict[str, Any] = compact(
        {"metadata": {k: meta[k] for k in CONFIGMAP_FIELDS if k in meta}, "data": body.get("data") or {}}
    )
    return snapshot


async def run_with_kopf(config: OperatorConfig) -> int:
    """Run the operator under kopf until a signal (0) or the loss of the Lease (1)."""
    import kopf

    stop = asyncio.Event()
    runtime = Runtime(config)
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry, id="credentials")
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # kopf's own client (it lists the API groups at start) uses the same credentials.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry, id="mqbalance")
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # Events are posted by the Writer, not from log lines
        settings.scanning.disabled = True  # kopf serves no resource: no need to discover CRDs or namespaces
        await runtime.start(stop)

    @kopf.on.cleanup(registry=registry, id="mqbalance")
    async def cleanup(**_: Any) -> None:
        await runtime.stop()

    with contextlib.suppress(asyncio.CancelledError):
        await kopf.operator(registry=registry, standalone=True, clusterwide=True, stop_flag=stop)
    return runtime.exit_code
