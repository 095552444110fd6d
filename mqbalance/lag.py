"""Consumer lag: the offsets a broker reports for a group, and the arithmetic on them.

Pure, like :mod:`mqbalance.rocketmq.remoting`: bytes in, values out (the asyncio client is
:mod:`mqbalance.operator.offsets`). A broker answers ``GET_CONSUME_STATS`` (request code 208,
header ``consumerGroup`` and ``topic``) with RocketMQ's ``ConsumeStats``: for every readable
queue of the topic on that broker, its max offset (``brokerOffset``) and the group's committed
offset (``consumerOffset``). The broker already reads a queue the group never committed (offset
-1) as 0, as ``mqadmin consumerProgress`` shows it: its lag is then every message the queue
holds. The lag of a queue is ``brokerOffset - consumerOffset`` (consumerProgress's ``#Diff``),
never below 0 here.

fastjson writes ``ConsumeStats.offsetTable`` (a ``Map<MessageQueue, OffsetWrapper>``) with
objects as keys, which no JSON parser reads::

    {"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-a","queueId":1,"topic":"orders"}:
     {"brokerOffset":5,"consumerOffset":0,"lastTimestamp":0,"pullOffset":0}}}

:func:`parse_fastjson_object_keys` reads that form.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mqbalance.json_limits import MAX_DEPTH, JsonError, TooDeep, loads, text_of
from mqbalance.model import Assignment, MessageQueue

GET_CONSUME_STATS = 208
"""RequestCode.GET_CONSUME_STATS: a group's offsets on one broker, per queue of a topic."""


class ConsumeStatsError(ValueError):
    """A ConsumeStats body that cannot be read."""


@dataclass(frozen=True)
class QueueOffsets:
    """One queue's offsets as a broker reports them (RocketMQ's OffsetWrapper)."""

    broker_offset: int
    """The queue's max offset: the offset the next message will get."""
    consumer_offset: int
    """The group's committed offset (0 when it never committed, as consumerProgress shows it)."""
    last_timestamp: int = 0
    """Store time (ms) of the last consumed message; 0 when unknown."""

    @property
    def lag(self) -> int:
        """Messages stored but not yet consumed by the group (consumerProgress's #Diff, at least 0)."""
        return max(0, self.broker_offset - self.consumer_offset)


@dataclass(frozen=True)
class ConsumeStats:
    """A broker's answer to GET_CONSUME_STATS."""

    offsets: Mapping[MessageQueue, QueueOffsets]
    consume_tps: float = 0.0


# -- decoding -----------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WORDS = {"true": True, "false": False, "null": None}


def parse_fastjson_object_keys(text: str) -> Any:
    """JSON as fastjson writes it, where a map's keys may be objects, numbers or strings.

    Objects become dicts; a key that is itself an object becomes a tuple of its sorted
    ``(name, value)`` pairs, so that it can be a dict key. ConsumeStatsError for anything else,
    nesting deeper than :data:`~mqbalance.json_limits.MAX_DEPTH` included.
    """
    try:
        value, end = _value(text, _skip(text, 0), 1)
    except TypeError as exc:  # a key that cannot be one: unhashable, or of items that do not sort
        raise ConsumeStatsError(f"a map key that cannot be one: {exc}") from None
    if _skip(text, end) != len(text):
        raise ConsumeStatsError(f"text after the value at {end}: {text[end : end + 40]!r}")
    return value


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _value(text: str, i: int, depth: int) -> tuple[Any, int]:
    if i >= len(text):
        raise ConsumeStatsError("unexpected end of the body")
    c = text[i]
    if c in "{[" and depth > MAX_DEPTH:
        raise ConsumeStatsError(f"nested deeper than {MAX_DEPTH} levels at {i}")
    if c == "{":
        return _object(text, i + 1, depth + 1)
    if c == "[":
        items: list[Any] = []
        i = _skip(text, i + 1)
        if i < len(text) and text[i] == "]":
            return items, i + 1
        while True:
            item, i = _value(text, _skip(text, i), depth + 1)
            items.append(item)
            i = _skip(text, i)
            if i < len(text) and text[i] == ",":
                i = _skip(text, i + 1)
                continue
            if i < len(text) and text[i] == "]":
                return items, i + 1
            raise ConsumeStatsError(f"expected ',' or ']' at {i}")
    if c == '"':
        j = i + 1
        while j < len(text) and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        try:
            return json.loads(text[i : j + 1]), j + 1
        except ValueError as exc:
            raise ConsumeStatsError(f"bad string at {i}: {exc}") from None
    for word, meaning in _WORDS.items():
        if text.startswith(word, i):
            return meaning, i + len(word)
    match = _NUMBER.match(text, i)
    if match is None:
        raise ConsumeStatsError(f"unexpected {text[i : i + 20]!r} at {i}")
    token = match.group()
    try:
        number: int | float = float(token) if any(ch in token for ch in ".eE") else int(token)
    except ValueError as exc:  # more digits than int() takes
        raise ConsumeStatsError(f"bad number at {i}: {exc}") from None
    return number, match.end()


def _object(text: str, i: int, depth: int) -> tuple[dict[Any, Any], int]:
    out: dict[Any, Any] = {}
    i = _skip(text, i)
    if i < len(text) and text[i] == "}":
        return out, i + 1
    while True:
        key, i = _value(text, _skip(text, i), depth)
        if isinstance(key, dict):
            key = tuple(sorted(key.items()))
        elif isinstance(key, list):
            key = tuple(key)
        i = _skip(text, i)
        if i >= len(text) or text[i] != ":":
            raise ConsumeStatsError(f"expected ':' at {i}")
        value, i = _value(text, _skip(text, i + 1), depth)
        out[key] = value
        i = _skip(text, i)
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        if i < len(text) and text[i] == "}":
            return out, i + 1
        raise ConsumeStatsError(f"expected ',' or '}}' at {i}")


_FLAT_OBJECT_KEY = re.compile(r'(?<=[{,])(\{[^{}"]*(?:"[^"\\]*"[^{}"]*)*\})(?=:)')
"""A flat object used as a map key (``{"brokerName":"b","queueId":0,"topic":"t"}:``)."""


def _parse_body(text: str) -> Any:
    """The fast way first: flat object keys quoted into strings, then the C JSON parser (a
    thousand queues in about a millisecond); the general parser when that fails."""
    try:
        document = loads(_FLAT_OBJECT_KEY.sub(lambda m: json.dumps(m.group(1)), text))
    except TooDeep as exc:
        raise ConsumeStatsError(f"body is {exc}") from None
    except JsonError:
        return parse_fastjson_object_keys(text)
    table = document.get("offsetTable") if isinstance(document, dict) else None
    if isinstance(table, dict):
        try:
            document["offsetTable"] = {
                tuple(sorted(loads(k).items())) if k.startswith("{") else k: v for k, v in table.items()
            }
        except (ValueError, AttributeError, TypeError):  # not a MessageQueue: the general parser says why
            return parse_fastjson_object_keys(text)
    return document


def decode_consume_stats(body: bytes) -> ConsumeStats:
    """The body of a successful GET_CONSUME_STATS response (4.x and 5.x write the same form);
    ConsumeStatsError for any other bytes."""
    try:
        document = _parse_body(text_of(body))
    except JsonError as exc:
        raise ConsumeStatsError(f"body is {exc}") from None
    if not isinstance(document, dict):
        raise ConsumeStatsError(f"ConsumeStats is not an object: {body[:200]!r}")
    table = document.get("offsetTable") or {}
    if not isinstance(table, dict):
        raise ConsumeStatsError(f"offsetTable is not an object: {body[:200]!r}")
    offsets: dict[MessageQueue, QueueOffsets] = {}
    try:
        for key, wrapper in table.items():
            mq = dict(key) if isinstance(key, tuple) else loads(key) if isinstance(key, str) else None
            if not isinstance(mq, dict) or not isinstance(wrapper, dict):
                raise ConsumeStatsError(f"offsetTable entry {key!r} is not a MessageQueue and OffsetWrapper")
            queue = MessageQueue(str(mq["topic"]), str(mq["brokerName"]), int(mq["queueId"]))
            consumer = int(wrapper.get("consumerOffset", 0))
            offsets[queue] = QueueOffsets(
                broker_offset=max(0, int(wrapper.get("brokerOffset", 0))),
                # -1: never committed (a static topic's broker leaves it so); read as 0, as
                # every other broker does before answering.
                consumer_offset=max(0, consumer),
                last_timestamp=int(wrapper.get("lastTimestamp", 0) or 0),
            )
        tps = float(document.get("consumeTps") or 0.0)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, ConsumeStatsError):
            raise
        raise ConsumeStatsError(f"ConsumeStats lacks or mistypes {exc}: {body[:300]!r}") from None
    return ConsumeStats(offsets, tps)


# -- lag of members and groups ------------------------------------------------------------------


@dataclass(frozen=True)
class MemberLag:
    member: str
    lag: int
    queues: int
    """Queues of the member whose offsets were read."""


@dataclass(frozen=True)
class GroupLag:
    """A group's lag at one sample, split by the members of its published assignment."""

    total: int
    queues: int
    """Queues whose offsets were read."""
    members: tuple[MemberLag, ...]
    """Every member of the assignment, most behind first (then by name)."""
    unowned: int = 0
    """Lag of queues that no member holds (unassigned, or in a handover)."""


def group_lag(offsets: Mapping[MessageQueue, QueueOffsets], topics: Mapping[str, Assignment]) -> GroupLag:
    """Lag per member through ``topics`` (RocketMQ topic -> member -> queues), and in total.

    Only the topics given count; a queue two members hold (BROADCASTING) counts for each of
    them but once in the total.
    """
    wanted = set(topics)
    total = sum(o.lag for q, o in offsets.items() if q.topic in wanted)
    queues = sum(1 for q in offsets if q.topic in wanted)
    per_member: dict[str, list[int]] = {}
    owned: set[MessageQueue] = set()
    for assignment in topics.values():
        for member, held in assignment.items():
            entry = per_member.setdefault(member, [0, 0])
            for queue in held:
                o = offsets.get(queue)
                if o is not None:
                    entry[0] += o.lag
                    entry[1] += 1
                    owned.add(queue)
    unowned = sum(o.lag for q, o in offsets.items() if q.topic in wanted and q not in owned)
    members = sorted(
        (MemberLag(m, lag, n) for m, (lag, n) in per_member.items()), key=lambda m: (-m.lag, m.member)
    )
    return GroupLag(total, queues, tuple(members), unowned)


# -- rates from successive samples --------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """Offsets read at ``time`` (seconds, any monotonic clock)."""

    time: float
    offsets: Mapping[MessageQueue, QueueOffsets] = field(default_factory=dict)


@dataclass(frozen=True)
class Rates:
    consume: float
    """Messages a second committed by the group."""
    produce: float
    """Messages a second stored in the queues."""


def rates(previous: Sample | None, current: Sample) -> Rates | None:
    """Consume and produce rates between two samples, over the queues read both times.

    A queue whose offsets went backwards (a reset offset, a broker that lost its store) counts
    0 for that step rather than a negative rate. None without an earlier sample or time between.
    """
    if previous is None or current.time <= previous.time:
        return None
    consumed = produced = 0
    for queue, now in current.offsets.items():
        before = previous.offsets.get(queue)
        if before is None:
            continue
        consumed += max(0, now.consumer_offset - before.consumer_offset)
        produced += max(0, now.broker_offset - before.broker_offset)
    seconds = current.time - previous.time
    return Rates(consume=consumed / seconds, produce=produced / seconds)


def most_behind(lag: GroupLag, limit: int) -> list[MemberLag]:
    """The members furthest behind, at most ``limit``, leaving out those with no lag."""
    return [m for m in lag.members if m.lag > 0][:limit]


def queues_of(topics: Mapping[str, Assignment]) -> Iterable[MessageQueue]:
    """Every queue an assignment gives to some member."""
    for assignment in topics.values():
        for held in assignment.values():
            yield from held


# -- the recommended member count ---------------------------------------------------------------

BACKLOG_SECONDS = 10.0
"""A member counts as saturated when it had at least this many seconds of its own consumption
waiting at both readings. RocketMQ's clients commit offsets every 5 seconds, so a member that
keeps up still shows up to 5 seconds of traffic as lag; twice that is a real backlog."""
DEFAULT_DRAIN_SECONDS = 300.0
"""The time the recommended members should take to consume the present backlog."""


def member_capacity(
    previous: Sample | None, current: Sample, topics: Mapping[str, Assignment]
) -> float | None:
    """Messages a second one member consumes when it has work waiting: the mean consume rate of
    the members that were saturated (see :data:`BACKLOG_SECONDS`) between two readings.

    Only a member with a backlog shows what it can do; one that keeps up consumes what arrives.
    None when no member was saturated (or without an earlier reading)."""
    if previous is None or current.time <= previous.time:
        return None
    seconds = current.time - previous.time
    held: dict[str, set[MessageQueue]] = {}
    for assignment in topics.values():
        for member, queues in assignment.items():
            held.setdefault(member, set()).update(queues)
    saturated: list[float] = []
    for members_queues in held.values():
        consumed = lag_before = lag_now = 0
        for queue in members_queues:
            now, before = current.offsets.get(queue), previous.offsets.get(queue)
            if now is None or before is None:
                continue
            consumed += max(0, now.consumer_offset - before.consumer_offset)
            lag_before += before.lag
            lag_now += now.lag
        rate = consumed / seconds
        if rate > 0 and min(lag_before, lag_now) >= rate * BACKLOG_SECONDS:
            saturated.append(rate)
    return sum(saturated) / len(saturated) if saturated else None


def recommended_members(
    *,
    queues: int,
    members: int,
    lag: int,
    produce_rate: float,
    capacity: float | None,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
) -> int:
    """Members the group needs: ``ceil(produce_rate / capacity + lag / (capacity * drain_seconds))``,
    enough to keep up with what arrives and to consume the backlog within ``drain_seconds``,
    clamped to ``[1, queues]`` (a member beyond the readable queues would hold none).

    ``capacity`` is :func:`member_capacity` (the last one measured). Without it (no member has had
    a backlog yet) nothing says what a member can do: nothing arriving and nothing waiting needs
    one member, anything else keeps the present ``members``.
    """
    upper = max(1, queues)
    if capacity is None or capacity <= 0:
        wanted = 1 if produce_rate <= 0 and lag <= 0 else members
    else:
        # The small allowance keeps a figure like 2.0000000001 (float noise) at 2.
        wanted = math.ceil(produce_rate / capacity + lag / (capacity * drain_seconds) - 1e-9)
    return min(upper, max(1, wanted))
