"""The injector's CertKeeper against a fake API: it creates or fills the Secret, takes what another replica
wrote when it loses the race, and patches only the webhooks whose caBundle differs."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import pytest

from mqbalance.injector import certs
from mqbalance.injector.main import WEBHOOK_CONFIGS, CertKeeper, keep_current, parse_args, write_files
from mqbalance.kube import ApiError, Conflict

SECRET = "/api/v1/namespaces/mq/secrets/tls"
CONFIG = f"{WEBHOOK_CONFIGS}/hook"
HOSTS = ["hook.mq.svc"]


class FakeKube:
    def __init__(self, secret: dict[str, Any] | None) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        if secret is not None:
            self.objects[SECRET] = secret
        self.objects[CONFIG] = {
            "webhooks": [{"name": "a", "clientConfig": {}}, {"name": "b", "clientConfig": {}}]
        }
        self.writes: list[str] = []
        self.patches: list[list[dict[str, Any]]] = []
        self.race: dict[str, Any] | None = None
        """Data another replica writes just before our next write."""

    async def get(self, path: str) -> dict[str, Any]:
        if path not in self.objects:
            raise ApiError(404, "not found")
        return dict(self.objects[path])

    def _write(self, verb: str, path: str, body: dict[str, Any], refusal: str) -> dict[str, Any]:
        """Record the write and store ``body``, unless another replica's write (``race``) comes first."""
        self.writes.append(verb)
        if self.race is not None:
            self.objects[SECRET] = {"metadata": {"name": "tls"}, "data": self.race}
            self.race = None
            raise Conflict(409, refusal)
        self.objects[path] = body
        return body

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._write("create", SECRET, body, "exists")

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._write("replace", path, body, "changed")

    async def json_patch(self, path: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.patches.append(ops)
        for op in ops:
            if op["op"] == "add":
                _, _, index, _, _ = op["path"].split("/")
                self.objects[path]["webhooks"][int(index)]["clientConfig"]["caBundle"] = op["value"]
        return self.objects[path]


def keeper(kube: FakeKube) -> CertKeeper:
    config = parse_args(["--namespace=mq", "--secret=tls", "--webhook-config=hook", f"--hosts={HOSTS[0]}"])
    return CertKeeper(kube, config)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_the_charts_empty_secret_is_filled_and_a_missing_one_created() -> None:
    kube = FakeKube({"metadata": {"name": "tls"}})
    bundle = await keeper(kube).ensure()
    assert kube.writes == ["replace"]
    assert certs.Bundle.from_secret_data(kube.objects[SECRET]["data"]) == bundle
    assert await keeper(kube).ensure() == bundle  # a restart takes what the Secret holds
    assert kube.writes == ["replace"]
    missing = FakeKube(None)
    await keeper(missing).ensure()
    assert missing.writes == ["create"]


@pytest.mark.asyncio
async def test_a_replica_that_loses_the_race_serves_the_winners_certificates() -> None:
    winner = certs.plan(None, HOSTS, dt.datetime.now(dt.UTC))
    for secret in ({"metadata": {"name": "tls"}}, None):
        kube = FakeKube(secret)
        kube.race = winner.to_secret_data()
        assert await keeper(kube).ensure() == winner


@pytest.mark.asyncio
async def test_only_webhooks_with_another_ca_bundle_are_patched() -> None:
    kube = FakeKube(None)
    k = keeper(kube)
    bundle = await k.ensure()
    assert await k.publish(bundle) is True
    (ops,) = kube.patches
    encoded = base64.b64encode(bundle.ca_cert).decode()
    assert ops == [
        {"op": "test", "path": "/webhooks/0/name", "value": "a"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": encoded},
        {"op": "test", "path": "/webhooks/1/name", "value": "b"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": encoded},
    ]
    assert await k.publish(bundle) is False
    assert len(kube.patches) == 1


def test_arguments_are_checked() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--namespace=mq", "--secret=tls", "--webhook-config=hook", "--hosts= , "])
    with pytest.raises(SystemExit):
        parse_args(
            [
                "--namespace=mq",
                "--secret=s",
                "--webhook-config=h",
                "--hosts=h",
                "--ca-days=1",
                "--cert-days=2",
            ]
        )
    with pytest.raises(SystemExit):
        parse_args(
            ["--namespace=mq", "--secret=s", "--webhook-config=h", "--hosts=h", '--sidecar-settings={"x":1}']
        )


@pytest.mark.asyncio
async def test_a_due_ca_is_published_beside_the_old_one_before_its_certificate_is_served(
    tmp_path: Path,
) -> None:
    now = dt.datetime.now(dt.UTC)
    life = certs.Lifetimes(ca=dt.timedelta(days=300), cert=dt.timedelta(days=300))
    old = certs.plan(None, HOSTS, now - dt.timedelta(days=201), life)  # its CA is due now
    kube = FakeKube({"metadata": {"name": "tls"}, "data": old.to_secret_data()})
    k = keeper(kube)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*write_files(old, tmp_path))
    served_at_patch: list[bytes] = []
    patch = kube.json_patch

    async def recording_patch(path: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        served_at_patch.append((tmp_path / certs.TLS_CERT).read_bytes())
        return await patch(path, ops)

    kube.json_patch = recording_patch  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(keep_current(k, context, old, tmp_path, stop, ca_propagation=0))
    give_up = asyncio.get_running_loop().time() + 30
    while (tmp_path / certs.TLS_CERT).read_bytes() == old.cert:
        assert asyncio.get_running_loop().time() < give_up, "the injector did not rotate its CA"
        await asyncio.sleep(0.01)
    stop.set()
    await task
    assert served_at_patch == [old.cert]  # still the old certificate when the caBundle was patched
    new = certs.Bundle.from_secret_data(kube.objects[SECRET]["data"])
    assert new is not None
    assert new.previous_ca_cert == old.ca_cert
    bundle = base64.b64decode(kube.objects[CONFIG]["webhooks"][0]["clientConfig"]["caBundle"])
    assert bundle == new.ca_cert + old.ca_cert
    assert (tmp_path / certs.TLS_CERT).read_bytes() == new.cert
