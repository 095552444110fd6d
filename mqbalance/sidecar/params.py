"""Reading a sidecar request: its query parameters, the group it names, a long-poll, a JSON body,
the route it asks for. Each refusal is an :class:`~mqbalance.sidecar.errors.ApiError` that names
the problem.
"""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

from mqbalance.contract.names import MAX_CLIENT_ID, valid_client_id
from mqbalance.listener import on_close
from mqbalance.sidecar.answers import RouteEntry, Served
from mqbalance.sidecar.errors import ApiError
from mqbalance.sidecar.keys import CONFIG, RECORDER, STATE
from mqbalance.sidecar.state import GroupState, SidecarState

DEFAULT_WAIT = 30.0
"""Long-poll timeout when ``after`` is given without ``timeout``."""


def check_params(request: web.Request, allowed: tuple[str, ...]) -> None:
    if not request.query_string:
        return
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        known = ", ".join(allowed) if allowed else "none"
        raise ApiError(400, f"unknown query parameter(s) {', '.join(unknown)}; known: {known}")


def group_of(request: web.Request) -> GroupState:
    state = request.app[STATE]
    name = request.query.get("group")
    if name is None:
        if len(state.groups) > 1:
            raise ApiError(
                400, f"several groups are served ({', '.join(state.groups)}); name one with ?group=NAME"
            )
        name = state.default_group
    return named_group(state, name)


def named_group(state: SidecarState, name: str) -> GroupState:
    """The group ``name`` names (its resource name or its RocketMQ name), else a 404."""
    group = state.group_named(name)
    if group is None:
        raise ApiError(404, f"group {name!r} is not served here; served: {', '.join(state.groups)}")
    return group


def long_poll(request: web.Request) -> tuple[int, float] | None:
    """(after, timeout) of a long-poll, or None for an immediate answer."""
    after_text = request.query.get("after")
    timeout_text = request.query.get("timeout")
    if after_text is None:
        if timeout_text is not None:
            raise ApiError(400, "timeout needs after: pass ?after=GENERATION&timeout=SECONDS")
        return None
    try:
        after = int(after_text)
    except ValueError:
        raise ApiError(400, f"after must be an integer generation (-1 for any), got {after_text!r}") from None
    if after < -1:
        raise ApiError(400, f"after must be -1 or more, got {after}")
    max_wait = request.app[CONFIG].max_wait
    if timeout_text is None:
        return after, min(DEFAULT_WAIT, max_wait)
    timeout = finite_number(timeout_text)
    if timeout is None or not 0 <= timeout <= max_wait:
        raise ApiError(
            400, f"timeout must be a number of seconds from 0 to {max_wait:g}, got {timeout_text!r}"
        )
    return after, timeout


def finite_number(value: str | float) -> float | None:
    """``value`` as a finite float, or None (JSON integers may be too large for a float)."""
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


async def served_of(request: web.Request) -> Served:
    return (await group_served(request))[1]


async def group_served(request: web.Request) -> tuple[GroupState, Served]:
    if not request.query_string:
        # The hot path: no group to pick, no long-poll, nothing to validate.
        state = request.app[STATE]
        if len(state.groups) == 1:
            only = state.groups[state.default_group]
            if (served := only.served) is not None:
                return only, served
    else:
        check_params(request, ("group", "after", "timeout", "client"))
        client_id = request.query.get("client")
        if client_id is not None:
            if not valid_client_id(client_id):
                raise ApiError(
                    400,
                    f"client must be a RocketMQ client id (printable, no spaces, 1 to {MAX_CLIENT_ID} "
                    f"characters), got {shown(client_id)!r}",
                )
            _note_client(request, client_id)
    group = group_of(request)
    poll = long_poll(request)
    served = group.served if poll is None else await group.wait_change(*poll)
    if served is None:
        raise ApiError(
            503,
            f"no assignment received yet for group {group.resource!r} "
            "(is the operator running and the ConfigMap published?)",
        )
    return group, served


def _note_client(request: web.Request, client_id: str) -> None:
    """Keep the client id (for the member Lease) and, where acknowledgements are recorded, watch its
    connection: once every named client closed its connections the pod's application is gone."""
    state = request.app[STATE]
    state.saw_client(client_id)
    if request.app[RECORDER] is None:
        return  # an assignment from a file: no operator to tell of an absence
    connection = request.protocol

    def closed(by_peer: bool) -> None:
        state.client_closed(client_id, connection, by_peer)

    if on_close(request, ("client", client_id), closed):
        state.client_connected(client_id, connection)


async def json_body(request: web.Request, fields: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    """The request's JSON object; fields and their types checked, unknown ones refused."""
    try:
        raw = await request.read()
    except web.RequestPayloadError as e:  # a broken chunked or compressed encoding
        raise ApiError(400, f"the request body cannot be read: {' '.join(str(e).split())}") from None
    if raw == b"{}" or not raw or raw.isspace():
        # {} is what a plain send posts: nothing to parse or check.
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:  # not JSON, or not UTF-8
        raise ApiError(400, f"the request body is not JSON: {e}") from None
    except RecursionError:
        raise ApiError(400, "the request body nests arrays or objects too deeply to decode") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    if unknown := body.keys() - fields.keys():
        known = ", ".join(fields)
        raise ApiError(400, f"unknown field(s) {', '.join(sorted(unknown))}; known: {known}")
    for name, value in body.items():
        types = fields[name]
        # bool is an int in Python; JSON true is not a latency.
        if value is not None and (
            not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        ):
            expected = " or ".join(_JSON_TYPES[t] for t in types)
            raise ApiError(400, f"field {name!r} must be {expected}, got {shown(json.dumps(value))}")
    return body


_JSON_TYPES = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}
SHOWN = 100
"""Characters of a client's value an error message quotes at most."""


def shown(text: str) -> str:
    """``text`` as an error message quotes it: cut after :data:`SHOWN` characters."""
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


def route_of(request: web.Request) -> RouteEntry:
    state = request.app[STATE]
    topic = request.match_info["topic"]
    found = state.route_entry(topic)
    if found is None:
        config = request.app[CONFIG]
        if not config.watch_topics:
            hint = "the sidecar runs with --no-topics, so it knows no routes"
        else:
            known = ", ".join(state.topic_names()) or "none"
            hint = f"no Topic resource in namespace {config.namespace!r} has that topic name (known: {known})"
        raise ApiError(404, f"no route for topic {topic!r}: {hint}")
    return found


def check_broker(request: web.Request, broker: str) -> None:
    """A 404 unless a route the sidecar serves names ``broker``: a send report for any other broker
    would grow the fault table and the isolation metric's label values without bound."""
    state = request.app[STATE]
    if state.routes_broker(broker):
        return
    if not request.app[CONFIG].watch_topics:
        hint = "the sidecar runs with --no-topics, so it knows no routes"
    else:
        known = state.route_brokers()
        listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        hint = f"no Topic's route names it (route brokers: {listed or 'none'})"
    raise ApiError(404, f"unknown broker {shown(repr(broker))}: {hint}")
