"""The sidecar application's typed state (aiohttp ``AppKey``), shared by the factory and the handlers."""

from __future__ import annotations

import asyncio

from aiohttp import web

from mqbalance.sidecar.acks import AckRecorder
from mqbalance.sidecar.config import SidecarConfig
from mqbalance.sidecar.state import SidecarState

STATE = web.AppKey("state", SidecarState)
CONFIG = web.AppKey("config", SidecarConfig)
RECORDER: web.AppKey[AckRecorder | None] = web.AppKey("recorder")
SOURCE_TASK: web.AppKey[asyncio.Task[None]] = web.AppKey("source_task")
OPENAPI = web.AppKey("openapi", bytes)
