"""Every decoder of a remote answer or of a document read from the API server turns any input into
a value or its own typed error, fuzzed with hypothesis. Inputs: arbitrary bytes; real answers and
documents (frames captured from NameServers, a handover document, valid specs) with values here
and there replaced by hostile ones (wrong types, huge, non-finite and overlong numbers); JSON of
the decoder's field names; each maybe nested thousands deep, keyed as fastjson keys maps,
truncated, or spoilt by bytes that are not UTF-8. Anything else escaping (UnicodeDecodeError,
RecursionError, struct.error, OverflowError, AttributeError, ...) fails the test, and hypothesis
shrinks it to a small input; a decoder that loops for ever trips the test's timeout.

The default run tries 150 inputs per decoder (2,100 in all, in seconds); ``--run-slow`` 7,500 per
decoder (105,000). Each test prints a figures line: inputs tried, how many decoded to a value, how
many to the decoder's error.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqbalance.contract import (
    AssignmentDocument,
    DocumentError,
    SpecError,
    decode_acks,
    read_topic,
    read_topic_spec,
)
from mqbalance.lag import ConsumeStatsError, decode_consume_stats, parse_fastjson_object_keys
from mqbalance.operator.spec import parse_group
from mqbalance.operator.writes import published_from
from mqbalance.rocketmq.remoting import FrameError, decode, decode_payload, parse_fastjson
from mqbalance.rocketmq.route import decode_cluster_info, decode_topic_route
from mqbalance.sidecar import watch
from tests.unit.sidecar.sidecar_support import FakeClock, make_config, make_state

DEFAULT_EXAMPLES = 150
"""Per decoder in the default run."""
SLOW_EXAMPLES = 7_500

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rocketmq"
FRAMES = tuple(sorted(p.read_bytes() for p in FIXTURES.glob("*.bin")))
"""Routes (standard and fastjson's bare keys), missing topics and cluster info of 4.9.7 and 5.3.3."""
BODIES = tuple(decode(f).body for f in FRAMES)

HUGE = "<huge>"
"""Written as a number longer than Python's int conversion allows (4300 digits)."""

# Field names the decoders look for, so that generated JSON reaches their conversions.
HEADER_KEYS = ("code", "opaque", "flag", "extFields", "remark", "language", "version")
ROUTE_KEYS = (
    "queueDatas", "brokerDatas", "brokerName", "readQueueNums", "writeQueueNums", "perm", "topicSysFlag",
    "cluster", "brokerAddrs", "zoneName", "orderTopicConf", "topicQueueMappingByBroker", "bname", "scope",
    "totalQueues", "epoch", "currIdMap", "brokerAddrTable", "clusterAddrTable", "0", "1",
)  # fmt: skip
STATS_KEYS = (
    "offsetTable", "consumeTps", "topic", "brokerName", "queueId", "brokerOffset", "consumerOffset",
    "lastTimestamp",
)  # fmt: skip
DOCUMENT_KEYS = (
    "group", "generation", "strategy", "messageModel", "computedAt", "reason", "members", "brokerZones",
    "topics", "handover", "releasing", "lease", "owner", "since", "seconds", "renewSeconds", "all",
    "pod-a", "broker-a",
)  # fmt: skip
SPEC_KEYS = (
    "topicName", "nameServer", "addresses", "pollSeconds", "aclSecretRef", "name", "brokers",
    "readQueueNums", "writeQueueNums", "perm", "zone", "master", "topics", "selector", "matchLabels",
    "matchExpressions", "key", "operator", "values", "messageModel", "strategy", "zoneLabel",
    "debounceSeconds", "handover", "mode", "releaseTimeoutSeconds", "brokerLockSeconds", "leaseSeconds",
    "renewSeconds", "leaseMarginSeconds", "groupName", "config", "broker", "queueId", "consumerIdcs",
    "inner", "zoneAffinity", "load", "tolerance", "samples", "maxQueueFactor", "virtualNodes", "In",
    "Exists", "CLUSTERING", "BROADCASTING", "STICKY", "CONFIG", "MACHINE_ROOM", "Release", "Orderly",
)  # fmt: skip

HEADER = {
    "code": 0,
    "flag": 1,
    "language": "JAVA",
    "opaque": 7,
    "serializeTypeCurrentRPC": "JSON",
    "version": 479,
    "extFields": {"topic": "orders"},
    "remark": "ok",
}
STATS_ENTRIES = [
    [
        {"brokerName": "broker-a", "queueId": q, "topic": "orders"},
        {"brokerOffset": 5, "consumerOffset": q, "lastTimestamp": 0, "pullOffset": 0},
    ]
    for q in range(2)
]
DOCUMENT = {
    "group": "orders-consumer",
    "generation": 7,
    "strategy": "STICKY",
    "messageModel": "CLUSTERING",
    "computedAt": 1795400000.1,
    "reason": "member-joined",
    "members": {"pod-a": "zone-a", "pod-b": "zone-b"},
    "brokerZones": {"broker-a": "zone-a"},
    "topics": {"orders": {"pod-a": {"broker-a": [0, 1]}, "pod-b": {"broker-a": [2]}}},
    "handover": "Release",
    "releasing": [
        {"owner": "pod-c", "generation": 7, "since": 1795400000.1, "topics": {"orders": {"broker-a": [3]}}}
    ],
    "lease": {"seconds": 20, "renewSeconds": 5},
}
ACK = {"generation": 12, "all": True}
TOPIC_SPECS = (
    {"brokers": [{"name": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "zone": "zone-a"}]},
    {
        "topicName": "orders",
        "nameServer": {"addresses": ["127.0.0.1:9876"], "pollSeconds": 30, "aclSecretRef": {"name": "acl"}},
        "brokers": [{"name": "broker-a", "zone": "zone-a"}],
    },
)
ROUTE_STATUS = {
    "nameServer": "127.0.0.1:9876",
    "brokers": [{"name": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "master": True}],
}
GROUP_SPECS = (
    {
        "topics": ["orders"],
        "selector": {
            "matchLabels": {"app": "o"},
            "matchExpressions": [{"key": "t", "operator": "In", "values": ["a"]}],
        },
        "messageModel": "CLUSTERING",
        "zoneLabel": "zone",
        "debounceSeconds": 2,
        "strategy": {
            "name": "STICKY",
            "zoneAffinity": True,
            "load": {"tolerance": 0.2, "samples": 3, "maxQueueFactor": 2},
        },
        "handover": {"mode": "Release", "releaseTimeoutSeconds": 30, "leaseSeconds": 20, "renewSeconds": 5},
    },
    {
        "topics": ["orders"],
        "selector": {},
        "strategy": {"name": "CONFIG", "config": {"pod-a": [{"broker": "broker-a", "queueId": 0}]}},
    },
    {
        "topics": ["orders"],
        "selector": {},
        "strategy": {"name": "MACHINE_ROOM_NEARBY", "inner": "AVG", "consumerIdcs": ["hz"]},
    },
    {"topics": ["orders"], "selector": {}, "strategy": {"name": "CONSISTENT_HASH", "virtualNodes": 10}},
)

NUMBERS = st.one_of(
    st.integers(-5, 70),
    st.integers(),
    st.integers(-400, 400).map(lambda e: 10 ** abs(e) * (-1 if e < 0 else 1)),  # beyond any float
    st.floats(),  # NaN and the infinities too: json writes them as NaN and Infinity
    st.just(HUGE),
)


@functools.cache  # a strategy is validated once, not at every draw
def json_values(keys: tuple[str, ...]) -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=8), st.sampled_from(keys))
    names = st.sampled_from(keys) | st.text(max_size=6)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=5),
        max_leaves=24,
    )


@st.composite
def mutated(draw: st.DrawFn, base: Any, keys: tuple[str, ...]) -> Any:
    """``base`` as is, or with about one value in 4, 16 or 64 (a whole subtree, maybe) replaced
    by a hostile one."""
    odds = draw(st.sampled_from((0, 4, 16, 64)))

    def walk(node: Any) -> Any:
        if odds and draw(st.integers(1, odds)) == 1:
            return draw(json_values(keys))
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(base)


def parsed(keys: tuple[str, ...], bases: tuple[Any, ...] = ()) -> st.SearchStrategy[Any]:
    """A parsed document: a base mutated (half the time), an object of the field names, or any JSON
    value."""
    roots = st.dictionaries(st.sampled_from(keys), json_values(keys), max_size=6) | json_values(keys)
    if not bases:
        return roots
    based = st.sampled_from(bases).flatmap(lambda base: mutated(base, keys))
    return st.one_of(based, roots)


def encoded(value: Any) -> str:
    return json.dumps(value).replace(json.dumps(HUGE), "9" * 4400)


NESTINGS = (("[", "]"), ('{"a":', "}"), ('{"queueDatas":[', "]}"), ("{{", "}:1}"))


@st.composite
def spoilt(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> bytes:
    """A text as is, or keyed as fastjson keys maps of integers, nested thousands deep, truncated,
    or with bytes that are not UTF-8 put in."""
    text = draw(texts)
    mode = draw(st.sampled_from(("plain", "plain", "bare-keys", "deep", "truncated", "not-utf8")))
    if mode == "bare-keys":
        text = re.sub(r'"(-?\d+)":', r"\1:", text)
    elif mode == "deep":
        opening, closing = draw(st.sampled_from(NESTINGS))
        depth = draw(st.sampled_from((63, 64, 65, 1000)) | st.integers(1, 5000))
        text = opening * depth + text + closing * depth
    data = text.encode()
    if mode == "truncated":
        data = data[: draw(st.integers(0, len(data)))]
    elif mode == "not-utf8":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"))) + data[at:]
    return data


@st.composite
def bytes_mutated(draw: st.DrawFn, base: bytes) -> bytes:
    """``base`` with a few bytes flipped, inserted or deleted, or cut short."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        change = draw(st.sampled_from(("flip", "insert", "delete", "cut")))
        if change == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif change == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif change == "delete":
            del data[at : at + draw(st.integers(1, 4))]
        elif change == "cut":
            del data[at:]
    return bytes(data)


def answers(
    keys: tuple[str, ...], bases: tuple[Any, ...] = (), raw: tuple[bytes, ...] = ()
) -> st.SearchStrategy[bytes]:
    """Bytes of an answer: JSON of ``keys`` (from ``bases``) spoilt, real bodies mutated, any bytes."""
    strategy = spoilt(parsed(keys, bases).map(encoded)) | st.binary(max_size=96)
    if raw:
        strategy = st.sampled_from(raw).flatmap(bytes_mutated) | strategy
    return strategy


@st.composite
def stats_text(draw: st.DrawFn) -> str:
    """A ConsumeStats body as fastjson writes it (MessageQueue objects as keys), its entries mutated."""
    entries = draw(mutated(STATS_ENTRIES, STATS_KEYS))
    entries = entries if isinstance(entries, list) else [entries]
    table = ",".join(
        f"{encoded(e[0])}:{encoded(e[1])}" if isinstance(e, list) and len(e) == 2 else encoded(e)
        for e in entries
    )
    return f'{{"consumeTps":{encoded(draw(NUMBERS))},"offsetTable":{{{table}}}}}'


SMALL = st.integers(-12, 40)


@st.composite
def binary_header(draw: st.DrawFn) -> bytes:
    """RocketMQ's binary header with lengths that may lie: negative, too long, too short."""
    header = struct.pack(
        ">hBhii",
        draw(st.integers(-(2**15), 2**15 - 1)),
        draw(st.integers(0, 255)),
        draw(st.integers(-(2**15), 2**15 - 1)),
        draw(st.integers(-(2**31), 2**31 - 1)),
        draw(st.integers(-(2**31), 2**31 - 1)),
    )
    remark = draw(st.binary(max_size=8))
    header += struct.pack(">i", len(remark) if draw(st.booleans()) else draw(SMALL)) + remark
    ext = b""
    for _ in range(draw(st.integers(0, 3))):
        key, value = draw(st.binary(max_size=4)), draw(st.binary(max_size=4))
        key_length = len(key) if draw(st.booleans()) else draw(st.integers(0, 12))
        value_length = len(value) if draw(st.booleans()) else draw(SMALL)
        ext += struct.pack(">H", key_length) + key + struct.pack(">i", value_length) + value
    ext_length = len(ext) if draw(st.booleans()) else draw(SMALL)
    return header + struct.pack(">i", ext_length) + ext[: draw(st.integers(0, len(ext)))]


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """A frame without its length prefix: a captured one mutated, or a JSON or binary header (its
    length true or not) and a body, or any bytes."""
    kind = draw(st.sampled_from(("captured", "json", "binary", "bytes")))
    if kind == "captured":
        return draw(st.sampled_from(FRAMES).flatmap(lambda f: bytes_mutated(f[4:])))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    header = (
        draw(spoilt(parsed(HEADER_KEYS, (HEADER,)).map(encoded))) if kind == "json" else draw(binary_header())
    )
    serialize = draw(st.sampled_from((0, 1)) | st.integers(0, 255))
    length = len(header) if draw(st.booleans()) else draw(st.integers(0, 2**24 - 1))
    return struct.pack(">I", (serialize << 24) | length) + header + draw(st.binary(max_size=16))


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    payload = draw(payloads())
    length = len(payload) if draw(st.booleans()) else draw(st.integers(-(2**31), 2**31 - 1))
    return struct.pack(">i", length) + payload


def text_of(data: bytes) -> str:
    """A ConfigMap's data value: always a string (the API server's JSON is UTF-8)."""
    return data.decode("utf-8", "replace")


_sidecar = make_state(make_config(groups=("orders",)), FakeClock())


def sidecar_reads(data: bytes) -> None:
    """The sidecar's ConfigMap watch: a document decoded and served (its answers encoded), or
    refused with the one served kept."""
    watch.apply_text(_sidecar, "orders", text_of(data))


def operator_reads(data: bytes) -> None:
    """The operator's read of an assignment ConfigMap (its watch cache or a GET)."""
    published_from({"metadata": {"name": "g-assignment"}, "data": {"assignment.json": text_of(data)}})


@dataclass(frozen=True)
class Decoder:
    name: str
    decode: Callable[[Any], object]
    errors: tuple[type[Exception], ...]
    """The decoder's own errors, which its callers handle; () for readers that never raise."""
    inputs: st.SearchStrategy[Any]


ROUTES = answers(ROUTE_KEYS, (), BODIES)
DOCUMENTS = answers(DOCUMENT_KEYS, (DOCUMENT, ACK))
SPECS = parsed(SPEC_KEYS, (*TOPIC_SPECS, *GROUP_SPECS))
DECODERS = (
    Decoder("frame", decode, (FrameError,), frames()),
    Decoder("payload", decode_payload, (FrameError,), payloads()),
    Decoder("fastjson", parse_fastjson, (FrameError,), ROUTES),
    Decoder("topic-route", lambda b: decode_topic_route("t", b), (FrameError,), ROUTES),
    Decoder("cluster-info", decode_cluster_info, (FrameError,), ROUTES),
    Decoder(
        "consume-stats",
        decode_consume_stats,
        (ConsumeStatsError,),
        spoilt(stats_text()) | answers(STATS_KEYS),
    ),
    Decoder(
        "fastjson-object-keys",
        lambda b: parse_fastjson_object_keys(text_of(b)),
        (ConsumeStatsError,),
        spoilt(stats_text()) | answers(STATS_KEYS),
    ),
    Decoder(
        "assignment-document", lambda b: AssignmentDocument.decode(text_of(b)), (DocumentError,), DOCUMENTS
    ),
    Decoder("operator-configmap", operator_reads, (), DOCUMENTS),
    Decoder("sidecar-configmap", sidecar_reads, (), DOCUMENTS),
    Decoder("release-acks", lambda b: decode_acks({"pod-a": text_of(b)}), (), DOCUMENTS),
    Decoder("topic-spec", lambda spec: read_topic_spec("t", spec), (), SPECS),
    Decoder(
        "topic-route-status",
        lambda pair: read_topic("t", *pair),
        (SpecError,),
        st.tuples(SPECS, parsed(SPEC_KEYS, (ROUTE_STATUS,))),
    ),
    Decoder("group-spec", lambda spec: parse_group("g", spec), (SpecError,), SPECS),
)


def fuzz(decoder: Decoder, examples: int) -> tuple[int, int]:
    """Inputs tried and how many of them decoded to a value; fails on any other exception."""
    tried = values = 0

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(decoder.inputs)
    def decodes(data: Any) -> None:
        nonlocal tried, values
        tried += 1
        try:
            decoder.decode(data)
        except decoder.errors:
            return
        values += 1

    decodes()
    return tried, values


@pytest.fixture(autouse=True)
def quiet_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar logs every document it refuses: thousands here."""
    quiet = logging.getLogger("mqbalance.tests.quiet")
    quiet.disabled = True
    monkeypatch.setattr(watch, "log", quiet)


@pytest.mark.parametrize(
    "examples",
    [DEFAULT_EXAMPLES, pytest.param(SLOW_EXAMPLES, marks=pytest.mark.slow)],
    ids=["default", "long"],
)
@pytest.mark.parametrize("decoder", DECODERS, ids=[d.name for d in DECODERS])
def test_a_decoder_gives_a_value_or_its_typed_error(decoder: Decoder, examples: int) -> None:
    tried, values = fuzz(decoder, examples)
    print(
        f"decoder fuzz figures: decoder={decoder.name} inputs={tried} values={values} errors={tried - values}"
    )
    assert tried >= examples
