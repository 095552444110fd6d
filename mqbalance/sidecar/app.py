"""The sidecar's HTTP API application (handlers in ``handlers.py``) and its metrics endpoint.

Every 4xx and 5xx answer is ``{"error": "...", "status": N}`` with a message that
names the problem, whichever layer raised it (a handler, the router, aiohttp).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from mqbalance.process_metrics import exposition
from mqbalance.producer import QueueSelector, wall_ms
from mqbalance.sidecar.acks import AckRecorder
from mqbalance.sidecar.config import SidecarConfig
from mqbalance.sidecar.errors import ApiError, error_response
from mqbalance.sidecar.handlers import routes
from mqbalance.sidecar.keys import CONFIG, OPENAPI, RECORDER, SOURCE_TASK, STATE
from mqbalance.sidecar.state import SidecarState
from mqbalance.sidecar.watch import AssignmentSource

__all__ = ["SOURCE_TASK", "STATE", "create_app", "create_metrics_app", "json_errors", "load_openapi"]

log = logging.getLogger(__name__)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e.status, e.message)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if isinstance(e, web.HTTPNotFound):
            message = f"no endpoint {request.method} {request.path}; the API is described at /openapi.json"
        elif isinstance(e, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(e.allowed_methods))
            message = f"method {e.method} is not allowed on {request.path}; use {allowed}"
            return error_response(e.status, message, {"Allow": ",".join(sorted(e.allowed_methods))})
        else:
            message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
        return error_response(e.status, message)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, f"internal error: {type(e).__name__}: {e}")


def load_openapi() -> bytes:
    return resources.files("mqbalance.sidecar").joinpath("openapi.json").read_bytes()


def create_app(
    config: SidecarConfig,
    *,
    source: AssignmentSource | None,
    state: SidecarState | None = None,
    recorder: AckRecorder | None = None,
) -> web.Application:
    """The API application; ``source`` feeds it in the background while it runs."""
    if state is None:
        # Wall-clock milliseconds, as RocketMQ's System.currentTimeMillis: isolatedUntilMs is unix ms.
        selector = QueueSelector(
            generation=config.fault_table.generation, fault_tolerance=config.fault_tolerance, clock=wall_ms
        )
        state = SidecarState(config.pod_name, config.groups, selector)
    app = web.Application(middlewares=[json_errors], client_max_size=64 * 1024)
    app[CONFIG] = config
    app[STATE] = state
    app[RECORDER] = recorder
    app[OPENAPI] = load_openapi()
    app.add_routes(routes)
    # aiohttp waits for running handlers after on_shutdown: long-polls must not hold a stopping
    # pod until they time out.
    app.on_shutdown.append(_stop_waiting)
    if source is not None:
        app.cleanup_ctx.append(_run_source(source))
    if recorder is not None:
        app.cleanup_ctx.append(_run_teller(recorder))
    return app


async def _stop_waiting(app: web.Application) -> None:
    app[STATE].stop_waiting()


def _run_source(source: AssignmentSource) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(source.run(app[STATE]), name="assignment-source")
        app[SOURCE_TASK] = task
        yield
        task.cancel()
        # A failure was already reported by whoever watched the task; shutdown goes on.
        await asyncio.gather(task, return_exceptions=True)

    return ctx


def _run_teller(recorder: AckRecorder) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(tell_operator(app[STATE], recorder), name="absence-teller")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    return ctx


RETELL_SECONDS = 1.0
"""Wait before recording again an acknowledgement the API server refused."""


async def tell_operator(state: SidecarState, recorder: AckRecorder) -> None:
    """Record the acknowledgements the sidecar owes the operator (an application gone, or back), the
    newest per group, retrying until the API server takes them; until cancelled."""
    failing = False
    while True:
        await state.told_changed.wait()
        state.told_changed.clear()
        while state.told:
            group, ack = next(iter(state.told.items()))
            try:
                await recorder.record(group, ack)
            except Exception as e:  # any failure: the operator must hear of it, so try again
                if not failing:
                    log.warning("group %s: could not record %s for the operator, retrying: %s", group, ack, e)
                failing = True
                await asyncio.sleep(RETELL_SECONDS)
                continue
            failing = False
            if state.told.get(group) == ack:
                del state.told[group]


def create_metrics_app(state: SidecarState) -> web.Application:
    """``/metrics`` for Prometheus, on its own port."""
    registry = state.metrics.registry

    async def metrics(request: web.Request) -> web.Response:
        resp = web.Response(body=exposition(registry, request.query.getall("name[]", [])))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/metrics", metrics)
    return app
