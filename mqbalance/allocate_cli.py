"""``mqbalance allocate``: compute a group's assignment from a JSON request (a dry run).

Modelled on RocketMQ's ``mqadmin allocateMQ``. A request::

    {"strategy": "AVG", "topic": "TopicTest",
     "queues": [["broker-a", 0], ["broker-a", 1]], "consumers": ["c1", "c2"]}

Optional fields: ``virtualNodes`` (CONSISTENT_HASH, 1 to 1000, default 10), ``inner``
(MACHINE_ROOM_NEARBY: AVG, AVG_BY_CIRCLE or CONSISTENT_HASH, default AVG),
``consumerIdcs`` (MACHINE_ROOM), ``config`` (CONFIG: ``{consumer: [{"broker": b,
"queueId": n}, ...]}``) and ``zoneAffinity`` (STICKY) are the strategy's parameters,
read exactly as a ConsumerGroup's ``spec.strategy``; ``brokerZones`` / ``consumerZones``
(``{name: zone}``), ``previous`` (the last assignment, ``{consumer: [[broker, queueId],
...]}``; STICKY uses it and the movement figures compare against it), ``messageModel``
(CLUSTERING or BROADCASTING) and ``name`` (a label echoed in the result). ``topic``
defaults to ``TopicTest``, the topic of RocketMQ's quick-start; it matters to
CONSISTENT_HASH, which hashes the queue's text.

The result is ``{"assignment": {consumer: [[broker, queueId], ...]}, "stats": {...}}``
or ``{"error": "..."}``. Exit status: 0, 1 if any request failed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from mqbalance.contract import SpecError, read_strategy
from mqbalance.model import (
    MessageModel,
    MessageQueue,
    StrategyName,
    StrategySpec,
    Zones,
    sort_queues,
)
from mqbalance.quality import measure
from mqbalance.strategies import AllocationError, allocate

DEFAULT_TOPIC = "TopicTest"
STRATEGY_FIELDS = ("virtualNodes", "inner", "consumerIdcs", "config", "zoneAffinity")
"""Request fields that are the strategy's parameters, as in a ConsumerGroup's spec.strategy."""

FIELDS = (
    "name",
    "strategy",
    "topic",
    "queues",
    "consumers",
    "virtualNodes",
    "inner",
    "consumerIdcs",
    "brokerZones",
    "consumerZones",
    "config",
    "previous",
    "zoneAffinity",
    "messageModel",
)


class RequestError(ValueError):
    """A request that cannot be allocated; the message says what to fix."""


@dataclass(frozen=True)
class Request:
    name: str | None
    spec: StrategySpec
    topic: str
    queues: tuple[MessageQueue, ...]
    consumers: tuple[str, ...]
    zones: Zones
    previous: dict[str, tuple[MessageQueue, ...]] | None
    message_model: MessageModel


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise RequestError(f"{what} must be a non-empty string, got {json.dumps(value)}")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestError(f"{what} must be an object, got {_type_name(value)}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise RequestError(f"{what} must be a list, got {_type_name(value)}")
    return value


def _queues(value: Any, topic: str, what: str) -> tuple[MessageQueue, ...]:
    queues = []
    for index, item in enumerate(_list(value, what)):
        where = f"{what}[{index}]"
        if not isinstance(item, list) or len(item) != 2:
            raise RequestError(f"{where} must be [brokerName, queueId], got {json.dumps(item)}")
        broker, queue_id = item
        _string(broker, f"{where} broker name")
        if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
            raise RequestError(f"{where} queue id must be a non-negative integer, got {json.dumps(queue_id)}")
        queues.append(MessageQueue(topic, broker, queue_id))
    return tuple(queues)


def _queue_map(value: Any, topic: str, what: str) -> dict[str, tuple[MessageQueue, ...]]:
    return {
        _string(consumer, f"a consumer in {what}"): _queues(queues, topic, f"{what}[{consumer!r}]")
        for consumer, queues in _object(value, what).items()
    }


def _zones(value: Any, what: str) -> dict[str, str]:
    return {
        _string(key, f"a name in {what}"): _string(zone, f"{what}[{key!r}]")
        for key, zone in _object(value, what).items()
    }


def _choice(value: Any, what: str, choices: Iterable[str]) -> str:
    options = list(choices)
    if value not in options:
        raise RequestError(f"{what} must be one of {', '.join(options)}, got {json.dumps(value)}")
    return str(value)


def parse_request(data: Any) -> Request:
    """Validate one request strictly; every error names the field and how to fix it."""
    request = _object(data, "a request")
    unknown = sorted(set(request) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(unknown)}; the fields are {', '.join(FIELDS)}")
    for required in ("strategy", "queues", "consumers"):
        if required not in request:
            raise RequestError(f"field {required!r} is missing; it is required")
    name = request.get("name")
    if name is not None:
        _string(name, "name")
    strategy = StrategyName(_choice(request["strategy"], "strategy", StrategyName))
    topic = _string(request.get("topic", DEFAULT_TOPIC), "topic")
    model = MessageModel(_choice(request.get("messageModel", "CLUSTERING"), "messageModel", MessageModel))
    # The strategy's parameters, read by the one reader of the ConsumerGroup's spec.strategy.
    parameters = {key: request[key] for key in STRATEGY_FIELDS if key in request}
    try:
        spec = read_strategy({"name": strategy.value, **parameters}, model, where="request")
    except SpecError as e:
        raise RequestError(str(e).replace("request.", "", 1)) from None
    consumers = tuple(_string(c, "a consumer id") for c in _list(request["consumers"], "consumers"))
    previous = _queue_map(request["previous"], topic, "previous") if "previous" in request else None
    return Request(
        name=name,
        spec=spec,
        topic=topic,
        queues=_queues(request["queues"], topic, "queues"),
        consumers=consumers,
        zones=Zones(
            brokers=_zones(request.get("brokerZones", {}), "brokerZones"),
            consumers=_zones(request.get("consumerZones", {}), "consumerZones"),
        ),
        previous=previous,
        message_model=model,
    )


def _pairs(queues: Iterable[MessageQueue]) -> list[list[str | int]]:
    return [[mq.broker_name, mq.queue_id] for mq in queues]


def run(request: Request) -> dict[str, Any]:
    assignment = allocate(
        request.spec,
        request.queues,
        request.consumers,
        zones=request.zones,
        previous=request.previous,
        message_model=request.message_model,
    )
    figures = measure(
        request.previous,
        assignment,
        zones=request.zones,
        queues=request.queues,
        message_model=request.message_model,
    )
    result: dict[str, Any] = {} if request.name is None else {"name": request.name}
    result["assignment"] = {consumer: _pairs(queues) for consumer, queues in assignment.items()}
    result["stats"] = figures.to_json()
    return result


def handle(data: Any) -> dict[str, Any]:
    """One request in, one result or ``{"error": ...}`` out."""
    try:
        return run(parse_request(data))
    except (RequestError, AllocationError) as error:
        return {"error": str(error)}


def handle_text(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        return {"error": f"the request is not valid JSON ({error}); send one JSON object"}
    return handle(data)


# --- table output ---------------------------------------------------------------------


def _compact(queues: Sequence[MessageQueue]) -> str:
    """``broker-a:0-3,7 broker-b:1``: runs of consecutive ids per broker."""
    by_broker: dict[str, list[int]] = {}
    for mq in sort_queues(queues):
        by_broker.setdefault(mq.broker_name, []).append(mq.queue_id)
    parts = []
    for broker, ids in by_broker.items():
        runs: list[str] = []
        start = previous = ids[0]
        for queue_id in [*ids[1:], None]:
            if queue_id is not None and queue_id == previous + 1:
                previous = queue_id
                continue
            runs.append(str(start) if start == previous else f"{start}-{previous}")
            if queue_id is not None:
                start = previous = queue_id
        parts.append(f"{broker}:{','.join(runs)}")
    return " ".join(parts) or "-"


def format_table(result: Mapping[str, Any], title: str | None = None) -> str:
    lines = [f"# {title}"] if title else []
    if "error" in result:
        return "\n".join([*lines, f"error: {result['error']}"])
    rows = [("CONSUMER", "QUEUES", "ASSIGNED")]
    for consumer, pairs in result["assignment"].items():
        queues = [MessageQueue("", broker, queue_id) for broker, queue_id in pairs]
        rows.append((consumer, str(len(queues)), _compact(queues)))
    width0 = max(len(row[0]) for row in rows)
    width1 = max(len(row[1]) for row in rows)
    lines += [f"{a.ljust(width0)}  {b.rjust(width1)}  {c}" for a, b, c in rows]
    s = result["stats"]
    lines.append(
        f"{s['members']} members, {s['queues']} queues; loads {s['minLoad']}..{s['maxLoad']} "
        f"(spread {s['spread']}); moved {s['moved']} (forced {s['forced']}, minimum {s['minimumMoves']}); "
        f"cross-zone {s['crossZone']}; unassigned {s['unassigned']}"
    )
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqbalance allocate",
        description="Compute a consumer group's assignment from a JSON request (a dry run).",
        epilog=(
            'example: echo \'{"strategy": "AVG", "queues": [["broker-a", 0], ["broker-a", 1]], '
            '"consumers": ["c1", "c2"]}\' | mqbalance allocate --format json'
        ),
    )
    parser.add_argument(
        "request", nargs="?", default="-", help="file with the request (default: standard input)"
    )
    parser.add_argument(
        "--jsonl", action="store_true", help="one request per line in, one result per line out"
    )
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        help="output format (default: table on a terminal, json otherwise)",
    )
    return parser


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        text = _read(args.request)
    except OSError as error:
        print(f"mqbalance allocate: cannot read {args.request}: {error.strerror}", file=sys.stderr)
        return 2
    out: IO[str] = sys.stdout
    table = (args.format or ("table" if out.isatty() else "json")) == "table"
    if args.jsonl:
        results = [handle_text(line) for line in text.splitlines() if line.strip()]
    else:
        results = [handle_text(text)]
    for number, result in enumerate(results, start=1):
        if table:
            title = result.get("name") or (f"request {number}" if args.jsonl else None)
            print(format_table(result, title), file=out)
            if args.jsonl and number < len(results):
                print(file=out)
        else:
            print(json.dumps(result, ensure_ascii=False), file=out)
    return 1 if any("error" in result for result in results) else 0
