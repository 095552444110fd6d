"""The hand-written OpenAPI document and the app's routes describe the same API."""

from __future__ import annotations

import json
import re

import pytest
from pytest_aiohttp import AiohttpClient

from mqbalance.sidecar.app import create_app, load_openapi
from tests.unit.sidecar.sidecar_support import make_config

METHODS = {"get", "post", "put", "patch", "delete"}


def app_operations() -> set[tuple[str, str]]:
    app = create_app(make_config(), source=None)
    out: set[tuple[str, str]] = set()
    for route in app.router.routes():
        if route.method == "HEAD":  # added by aiohttp beside every GET
            continue
        info = route.resource.get_info() if route.resource else {}
        path = str(info.get("path") or info.get("formatter"))
        out.add((route.method.lower(), path))
    return out


def documented_operations() -> set[tuple[str, str]]:
    doc = json.loads(load_openapi())
    return {(m, path) for path, item in doc["paths"].items() for m in item if m in METHODS}


def test_every_route_is_documented_and_every_documented_path_exists() -> None:
    assert app_operations() == documented_operations()


def test_every_reference_resolves_and_path_parameters_are_declared() -> None:
    doc = json.loads(load_openapi())
    assert doc["openapi"].startswith("3.")
    text = json.dumps(doc)
    for ref in set(re.findall(r'"\$ref": "#/([^"]+)"', text)):
        node = doc
        for part in ref.split("/"):
            assert part in node, f"dangling $ref #/{ref}"
            node = node[part]
    for path, item in doc["paths"].items():
        declared = set(re.findall(r"{(\w+)}", path))
        for method, op in item.items():
            params = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert params == declared, (method, path)
            assert op["responses"], (method, path)


@pytest.mark.asyncio
async def test_the_document_is_served(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(create_app(make_config(), source=None))
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    assert await resp.json() == json.loads(load_openapi())
