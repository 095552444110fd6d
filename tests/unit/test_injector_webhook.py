"""The webhook's HTTP side: AdmissionReview in, JSON patch out; bad requests get a 4xx JSON error."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from mqbalance.injector.spec import CONTAINER_NAME, GROUP_ANNOTATION, SidecarSettings
from mqbalance.injector.webhook import create_app
from tests.unit.injector_support import apply_patch


def review(obj: Any, operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b1c",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": operation,
            "object": obj,
        },
    }


POD: dict[str, Any] = {
    "metadata": {"generateName": "orders-", "annotations": {GROUP_ANNOTATION: "orders"}},
    "spec": {"containers": [{"name": "app", "image": "a:1"}]},
}


pytestmark = pytest.mark.asyncio

Client = TestClient[web.Request, web.Application]


@pytest_asyncio.fixture
async def client(aiohttp_client: AiohttpClient) -> Client:
    return await aiohttp_client(create_app(SidecarSettings(), frozenset({"mq-mqbalance-sidecar"})))


async def test_an_annotated_pod_gets_a_json_patch(client: Client) -> None:
    resp = await client.post("/mutate", json=review(POD))
    assert resp.status == 200
    answer = await resp.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "0b1c"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patched = apply_patch(POD, json.loads(base64.b64decode(response["patch"])))
    assert [c["name"] for c in patched["spec"]["containers"]] == ["app", CONTAINER_NAME]


async def test_a_pod_of_an_account_without_the_sidecar_role_gets_a_warning(client: Client) -> None:
    """Its sidecar would be refused its assignment: kubectl shows the warning at once."""
    for account, warned in [("mq-mqbalance-sidecar", False), ("orders-app", True), (None, True)]:
        spec = {**POD["spec"], **({"serviceAccountName": account} if account else {})}
        answer = await (await client.post("/mutate", json=review({**POD, "spec": spec}))).json()
        response = answer["response"]
        assert response["patchType"] == "JSONPatch"
        warnings = response.get("warnings", [])
        assert bool(warnings) == warned, (account, warnings)
        if warned:
            assert f"ServiceAccount {account or 'default'!r}" in warnings[0]
            assert "sidecar.serviceAccounts" in warnings[0]


async def test_pods_without_the_annotation_and_other_operations_pass_unchanged(
    client: Client,
) -> None:
    for body in (review({"metadata": {}, "spec": {"containers": []}}), review(None, operation="DELETE")):
        answer = await (await client.post("/mutate", json=body)).json()
        assert answer["response"] == {"uid": "0b1c", "allowed": True}


async def test_a_bad_annotation_is_refused_with_a_message(client: Client) -> None:
    bad = {**POD, "metadata": {"annotations": {GROUP_ANNOTATION: "Not_A_Name"}}}
    answer = await (await client.post("/mutate", json=review(bad))).json()
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert GROUP_ANNOTATION in response["status"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "complaint"),
    [
        (b"not json", 400, "not JSON"),
        (b"[]", 400, "AdmissionReview object"),
        (json.dumps({**review(POD), "apiVersion": "admission.k8s.io/v1beta1"}).encode(), 400, "v1"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), 400, "uid"),
        (json.dumps(review(POD, kind="Deployment")).encode(), 400, "Pods only"),
        (
            json.dumps({**review(POD), "request": {**review(POD)["request"], "object": None}}).encode(),
            400,
            "object",
        ),
    ],
)
async def test_a_bad_request_gets_a_4xx_json_error(
    client: Client,
    body: bytes,
    status: int,
    complaint: str,
) -> None:
    resp = await client.post("/mutate", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == status
    answer = await resp.json()
    assert answer["status"] == status
    assert complaint in answer["error"]


def with_object(obj: Any) -> bytes:
    return json.dumps({**review(POD), "request": {**review(POD)["request"], "object": obj}}).encode()


ANNOTATED = {"annotations": {GROUP_ANNOTATION: "orders"}}


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (b"[" * 50_000, "too deeply"),
        (b'{"request": ' + b"[" * 50_000 + b"}", "too deeply"),
        (b"\xff\xfe{}", "not JSON"),
        (with_object({"metadata": "orders"}), "metadata"),
        (with_object({"metadata": {"annotations": ["orders"]}}), "annotations"),
        (with_object({"metadata": {"annotations": {GROUP_ANNOTATION: 3}}}), "annotations"),
        (with_object({"metadata": {**ANNOTATED, "labels": "x"}}), "labels"),
        (with_object({"metadata": ANNOTATED, "spec": []}), "spec"),
        (with_object({"metadata": ANNOTATED, "spec": {"containers": "app"}}), "containers"),
        (with_object({"metadata": ANNOTATED, "spec": {"containers": ["app"]}}), "containers"),
        (with_object({"metadata": ANNOTATED, "spec": {"volumes": [1]}}), "volumes"),
    ],
    ids=[
        "deep",
        "deep-in-a-field",
        "not-utf-8",
        "metadata",
        "annotations",
        "annotation-value",
        "labels",
        "spec",
        "containers",
        "container",
        "volume",
    ],
)
async def test_a_malformed_review_is_400_not_500(client: Client, body: bytes, complaint: str) -> None:
    resp = await client.post("/mutate", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 400, await resp.text()
    answer = await resp.json()
    assert answer["status"] == 400
    assert complaint in answer["error"]


async def test_a_body_that_cannot_be_decoded_is_400(client: Client) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    resp = await client.post("/mutate", data=b"\x1f\x8b garbage", headers=headers)
    assert resp.status == 400, await resp.text()
    assert "gzip" in (await resp.json())["error"]


async def test_wrong_content_type_and_health(client: Client) -> None:
    resp = await client.post("/mutate", data=b"{}", headers={"Content-Type": "text/plain"})
    assert resp.status == 415
    assert (await resp.json())["status"] == 415
    assert (await client.get("/healthz")).status == 200
