"""``mqbalance injector``: the sidecar injection webhook (docs/deploy.md, "Sidecar injection").

At start it loads the CA and serving certificate from its Secret (making them when the Secret holds none
or renewing what is due), writes the ``caBundle`` into the MutatingWebhookConfiguration, and serves
HTTPS. Then it checks again when the next renewal is due (at the latest every ``--check-interval``),
loads a certificate another replica renewed, and keeps the ``caBundle`` current.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import logging
import os
import signal
import ssl
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from mqbalance import listener
from mqbalance.injector import certs
from mqbalance.injector.spec import SidecarSettings
from mqbalance.injector.webhook import create_app
from mqbalance.kube import ApiError, Conflict, KubeClient

log = logging.getLogger("mqbalance.injector")

SETTINGS_ENV = "MQBALANCE_INJECTOR_SIDECAR"
CA_PROPAGATION_SECONDS = 30.0
"""How long a new CA is published before a certificate of it is served."""
WEBHOOK_CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@dataclass(frozen=True)
class InjectorConfig:
    namespace: str
    secret: str
    webhook_config: str
    hosts: tuple[str, ...]
    host: str
    port: int
    settings: SidecarSettings
    accounts: frozenset[str]
    """The ServiceAccounts the chart gives the sidecar Role: a pod running as another is warned."""
    lifetimes: certs.Lifetimes
    check_interval: float
    kubeconfig: str | None
    limits: listener.Limits = field(default_factory=listener.Limits)


def parse_args(argv: Sequence[str]) -> InjectorConfig:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="mqbalance injector", description=__doc__.split("\n\n")[0])
    p.add_argument("--namespace", default=env("POD_NAMESPACE"), help="namespace of the certificate Secret")
    p.add_argument("--secret", required=True, help="Secret holding the CA and the serving certificate")
    p.add_argument(
        "--webhook-config", required=True, help="MutatingWebhookConfiguration whose caBundle to keep current"
    )
    p.add_argument(
        "--hosts",
        required=True,
        help="comma-separated DNS names and IP addresses of the serving certificate "
        "(<service>.<namespace>.svc, or 127.0.0.1 for a url webhook)",
    )
    p.add_argument(
        "--host",
        default="0.0.0.0",
        help="address to listen on, several separated by commas (default 0.0.0.0; the chart: the pod's IP)",
    )
    p.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    p.add_argument(
        "--sidecar-settings",
        default=env(SETTINGS_ENV, ""),
        help=f"JSON object of the chart's sidecar values (image, port, ...; ${SETTINGS_ENV})",
    )
    p.add_argument(
        "--sidecar-service-account",
        action="append",
        default=[],
        metavar="NAME",
        help="a ServiceAccount the chart gives the sidecar Role (repeat for several): admitting a pod that "
        "runs as another warns that its sidecar will be refused",
    )
    p.add_argument("--ca-days", type=float, default=365 * 5, help="CA lifetime in days (default 1825)")
    p.add_argument("--cert-days", type=float, default=90, help="serving certificate lifetime in days (90)")
    p.add_argument(
        "--check-interval", type=float, default=600, help="seconds between checks of the Secret (600)"
    )
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="credentials outside a pod")
    listener.add_arguments(p)
    args = p.parse_args(list(argv))
    if not args.namespace:
        p.error("--namespace (or $POD_NAMESPACE) is required")
    hosts = tuple(h.strip() for h in args.hosts.split(",") if h.strip())
    if not hosts:
        p.error("--hosts names no host")
    if args.cert_days <= 0 or args.ca_days < args.cert_days:
        p.error("--cert-days must be above 0 and --ca-days at least --cert-days")
    try:
        settings = SidecarSettings.from_json(args.sidecar_settings)
    except (ValueError, TypeError) as e:
        p.error(f"--sidecar-settings: {e}")
    try:
        limits = listener.limits_from(args)
        listener.parse_hosts(args.host)
    except ValueError as e:
        p.error(str(e))
    return InjectorConfig(
        namespace=args.namespace,
        secret=args.secret,
        webhook_config=args.webhook_config,
        hosts=hosts,
        host=args.host,
        port=args.port,
        settings=settings,
        accounts=frozenset(args.sidecar_service_account),
        lifetimes=certs.Lifetimes(dt.timedelta(days=args.ca_days), dt.timedelta(days=args.cert_days)),
        check_interval=max(1.0, args.check_interval),
        kubeconfig=args.kubeconfig,
        limits=limits,
    )


class CertKeeper:
    """Keeps the Secret's certificates current and the webhook configuration's caBundle in step."""

    def __init__(self, kube: KubeClient, config: InjectorConfig) -> None:
        self.kube = kube
        self.config = config
        self.path = f"/api/v1/namespaces/{config.namespace}/secrets/{config.secret}"

    async def ensure(self, now: dt.datetime | None = None) -> certs.Bundle:
        """The bundle the Secret holds after renewing what is due (creating the Secret if missing).
        A replica that loses a race to write takes what the winner wrote."""
        for _ in range(10):
            moment = now or dt.datetime.now(dt.UTC)
            try:
                secret: dict[str, Any] | None = await self.kube.get(self.path)
            except ApiError as e:
                if e.status != 404:
                    raise
                secret = None
            current = certs.Bundle.from_secret_data((secret or {}).get("data"))
            wanted = certs.plan(current, self.config.hosts, moment, self.config.lifetimes)
            if wanted == current:
                return wanted
            try:
                if secret is None:
                    await self.kube.create(
                        f"/api/v1/namespaces/{self.config.namespace}/secrets",
                        {
                            "apiVersion": "v1",
                            "kind": "Secret",
                            "metadata": {"name": self.config.secret, "namespace": self.config.namespace},
                            "type": "Opaque",
                            "data": wanted.to_secret_data(),
                        },
                    )
                else:
                    await self.kube.replace(self.path, {**secret, "data": wanted.to_secret_data()})
            except Conflict:
                continue  # another replica wrote first: read what it wrote
            log.info(
                "wrote certificates to Secret %s/%s: serving certificate valid until %s, CA until %s",
                self.config.namespace,
                self.config.secret,
                certs.not_after(wanted.cert).isoformat(),
                certs.not_after(wanted.ca_cert).isoformat(),
            )
            return wanted
        raise ApiError(409, f"Secret {self.config.namespace}/{self.config.secret} kept changing")

    async def publish(self, bundle: certs.Bundle, now: dt.datetime | None = None) -> bool:
        """Write the caBundle into every webhook of the configuration; True when something changed."""
        ca_bundle = base64.b64encode(bundle.ca_bundle(now or dt.datetime.now(dt.UTC))).decode()
        path = f"{WEBHOOK_CONFIGS}/{self.config.webhook_config}"
        config = await self.kube.get(path)
        ops: list[dict[str, Any]] = []
        for i, hook in enumerate(config.get("webhooks") or []):
            if (hook.get("clientConfig") or {}).get("caBundle") != ca_bundle:
                # The test guards against a concurrent change of the list between our read and the patch.
                ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]})
                ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca_bundle})
        if not ops:
            return False
        await self.kube.json_patch(path, ops)
        log.info("updated the caBundle of MutatingWebhookConfiguration %s", self.config.webhook_config)
        return True


def write_files(bundle: certs.Bundle, directory: Path) -> tuple[Path, Path]:
    cert, key = directory / certs.TLS_CERT, directory / certs.TLS_KEY
    for path, data in ((cert, bundle.cert), (key, bundle.key)):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o600)
        tmp.replace(path)
    return cert, key


async def keep_current(
    keeper: CertKeeper,
    context: ssl.SSLContext,
    served: certs.Bundle,
    directory: Path,
    stop: asyncio.Event,
    ca_propagation: float = CA_PROPAGATION_SECONDS,
) -> None:
    """Renew when due, load certificates another replica wrote, keep the caBundle current."""
    backoff = 1.0
    while not stop.is_set():
        due = (certs.next_renewal(served) - dt.datetime.now(dt.UTC)).total_seconds()
        wait = min(keeper.config.check_interval, max(due, 0.0)) if backoff == 1.0 else backoff
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await stop.wait()
        if stop.is_set():
            return
        try:
            bundle = await keeper.ensure()
            # The API server must trust a new CA before any replica serves a certificate of it.
            await keeper.publish(bundle)
            if bundle.ca_cert != served.ca_cert and certs.not_after(served.cert) > dt.datetime.now(dt.UTC):
                # API servers read webhook configurations from a watch: give them time to see the new CA.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(ca_propagation):
                        await stop.wait()
            if bundle.cert != served.cert:
                context.load_cert_chain(*write_files(bundle, directory))
                log.info("serving the certificate valid until %s", certs.not_after(bundle.cert).isoformat())
            served, backoff = bundle, 1.0
        except (ApiError, OSError, ssl.SSLError) as e:
            backoff = min(backoff * 2, 60.0)
            log.warning("could not check the certificates (again in %.0f s): %s", backoff, e)


async def serve(config: InjectorConfig) -> int:
    try:
        kube = await KubeClient.connect(config.kubeconfig)
    except Exception as e:  # the loaders raise several types; all mean "cannot reach the API"
        log.error("cannot configure the Kubernetes client: %s", e)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    keeper = CertKeeper(kube, config)
    runner: web.AppRunner | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="mqbalance-injector-") as tmp:
            directory = Path(tmp)
            while True:  # the API server may not answer yet (a pod starting with its cluster)
                try:
                    bundle = await keeper.ensure()
                    await keeper.publish(bundle)
                    break
                except ApiError as e:
                    log.warning("could not prepare the certificates (retrying in 2 s): %s", e)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(2):
                            await stop.wait()
                    if stop.is_set():
                        return 0
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(*write_files(bundle, directory))
            runner = await listener.serve(
                create_app(config.settings, config.accounts),
                listener.parse_hosts(config.host),
                config.port,
                config.limits,
                ssl_context=context,
            )
            log.info(
                "injecting sidecars on https://%s:%d/mutate (certificate for %s, valid until %s)",
                config.host,
                config.port,
                ",".join(config.hosts),
                certs.not_after(bundle.cert).isoformat(),
            )
            await keep_current(keeper, context, bundle, directory, stop)
    finally:
        if runner is not None:
            await runner.cleanup()
        await kube.close()
    return 0


def main(argv: Sequence[str]) -> int:
    config = parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("MQBALANCE_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(serve(config))
