"""The remoting codec on frames captured from real NameServers (``python -m harness.rocketmq capture``)."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from mqbalance.model import PERM_READ, UNKNOWN_ZONE, Broker
from mqbalance.rocketmq.remoting import (
    FLAG_RESPONSE,
    Credentials,
    FrameError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    decode,
    decode_payload,
    encode,
    frame_length,
    parse_fastjson,
    request,
    sign,
)
from mqbalance.rocketmq.route import decode_cluster_info, decode_topic_route

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rocketmq"
VERSIONS = ("5.3.3", "4.9.7")


def frame(version: str, name: str) -> bytes:
    return (FIXTURES / f"{version}-{name}.bin").read_bytes()


def ports(version: str) -> dict[str, int]:
    loaded: dict[str, int] = json.loads((FIXTURES / f"{version}-ports.json").read_text())
    return loaded


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["route-orders", "route-orders-old-client"])
def test_real_route_decodes_to_the_created_topic(version: str, name: str) -> None:
    response = decode(frame(version, name))
    assert response.is_response
    assert response.code == ResponseCode.SUCCESS
    assert response.language == "JAVA"
    route = decode_topic_route("orders", response.body)
    assert route.to_topic_route().brokers == (
        Broker("broker-a", read_queue_nums=8, write_queue_nums=4, perm=6),
        Broker("broker-b", read_queue_nums=2, write_queue_nums=2, perm=PERM_READ),
    )
    addresses = {b.broker_name: b.master_address for b in route.broker_datas}
    expected = {n: f"127.0.0.1:{ports(version)[n]}" for n in ("broker-a", "broker-b")}
    assert addresses == expected
    assert route.brokers_without_master() == []
    assert route.readable
    assert route.writable


@pytest.mark.parametrize("version", VERSIONS)
def test_old_clients_get_bare_integer_keys(version: str) -> None:
    # What the NameServer answers a client older than 4.9.4 is not JSON...
    body = decode(frame(version, "route-orders-old-client")).body
    assert b'"brokerAddrs":{0:' in body
    with pytest.raises(ValueError, match="Expecting property name"):
        json.loads(body)
    # ...and a current client gets standard JSON.
    assert json.loads(decode(frame(version, "route-orders")).body)["brokerDatas"]


@pytest.mark.parametrize("version", VERSIONS)
def test_missing_topic_is_code_17_with_a_remark(version: str) -> None:
    response = decode(frame(version, "route-missing"))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert response.remark is not None
    assert "No topic route info in name server for the topic: missing" in response.remark
    assert response.body == b""


@pytest.mark.parametrize("version", VERSIONS)
def test_cluster_info(version: str) -> None:
    info = decode_cluster_info(decode(frame(version, "cluster-info")).body)
    assert info.clusters == {"mqbalance": ("broker-a", "broker-b")}
    assert info.brokers["broker-b"].master_address == f"127.0.0.1:{ports(version)['broker-b']}"


@pytest.mark.parametrize("serialize", list(SerializeType))
def test_encode_decode_round_trip(serialize: SerializeType) -> None:
    command = RemotingCommand(
        code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
        opaque=42,
        flag=FLAG_RESPONSE,
        ext_fields={"topic": "orders", "acceptStandardJsonOnly": "true"},
        remark="a remark é",
        body=b"\x00\x01body",
        serialize_type=serialize,
    )
    assert decode(encode(command)) == command


def test_request_fields_are_java_strings() -> None:
    command = request(RequestCode.UPDATE_AND_CREATE_TOPIC, 1, {"perm": 6, "order": False, "skip": None})
    assert command.ext_fields == {"perm": "6", "order": "false"}
    header = json.loads(encode(command)[8:])
    assert header["code"] == 17
    assert header["extFields"] == {"perm": "6", "order": "false"}
    assert header["language"] == "PYTHON"
    assert header["flag"] == 0


def test_frame_layout() -> None:
    data = encode(RemotingCommand(code=105, body=b"xyz"))
    header_length = int.from_bytes(data[4:8], "big") & 0xFFFFFF
    assert data[4] == SerializeType.JSON
    assert frame_length(data[:4]) == len(data) - 4 == 4 + header_length + 3
    assert data.endswith(b"xyz")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x00\x00\x02", "outside 4.."),
        (b"HTTP", "not a RocketMQ remoting peer"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x10abcd", "header length 16 exceeds"),
        (b"\x00\x00\x00\x06\x05\x00\x00\x00ab", "unknown serialize type 5"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x04{no}", "header is not JSON"),
        (b"\x00\x00\x00\x09\x00\x00\x00\x04[]", "announces 9 bytes"),
    ],
)
def test_bad_frames_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode(data)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{0:"a",1:"b"}', {"0": "a", "1": "b"}),
        ('{"m":{ -1 :"x"}, "l":[1, 2]}', {"m": {"-1": "x"}, "l": [1, 2]}),
        ('{"s":"{0:not a key}", 7:{8:[9]}}', {"s": "{0:not a key}", "7": {"8": [9]}}),
        ('{"q":"say \\"1:\\"", 2:3}', {"q": 'say "1:"', "2": 3}),
    ],
)
def test_fastjson_bare_keys(text: str, expected: object) -> None:
    assert parse_fastjson(text) == expected


def test_fastjson_garbage_is_an_error() -> None:
    with pytest.raises(FrameError, match="not JSON"):
        parse_fastjson(b"{oops")


def json_payload(header: bytes) -> bytes:
    return struct.pack(">I", len(header)) + header


def binary_payload(ext: bytes) -> bytes:
    """A binary header whose ext fields are ``ext`` (key length, key, value length, value, ...)."""
    header = struct.pack(">hBhii", 0, 0, 479, 1, 1) + struct.pack(">i", 0) + struct.pack(">i", len(ext)) + ext
    return struct.pack(">I", (1 << 24) | len(header)) + header


@pytest.mark.timeout(30)  # a length that walked the position back made the decoder loop for ever
@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "at least its 4-byte header length, got 0"),
        (b"\x00\x00\x00", "at least its 4-byte header length, got 3"),
        (json_payload(b"[" * 100_000), "header is not JSON: nested deeper than 64"),
        (json_payload(b'{"a":\xff}'), "header is not JSON: not UTF-8"),
        (json_payload(b'{"code":0,"opaque":1e400}'), "header mistypes a field"),
        (json_payload(b'{"code":0,"remark":[1]}'), "remark not a string"),
        (
            binary_payload(struct.pack(">H", 1) + b"k" + struct.pack(">i", -7) + b"pad"),
            "-7 bytes at 28 outside",
        ),
        (
            binary_payload(struct.pack(">H", 1) + b"k" + struct.pack(">i", 9) + b"short"),
            "9 bytes at 28 outside",
        ),
    ],
)
def test_bad_payloads_are_frame_errors(payload: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode_payload(payload)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"queueDatas":"\xff"}', "body is not UTF-8"),
        (b"[" * 100_000, "body is nested deeper than 64 levels"),
        (b"[" * 65 + b"]" * 65, "body is nested deeper than 64 levels"),
        (
            b'{"queueDatas":[{"brokerName":"a","readQueueNums":1e400,"writeQueueNums":1,"perm":6}]}',
            "infinity",
        ),
        (b'{"queueDatas":[{"brokerName":"a","readQueueNums":' + b"9" * 5000 + b"}]}", "not JSON"),
        (b'{"brokerDatas":[{"brokerName":"a","brokerAddrs":[1]}]}', "has no attribute 'items'"),
        (b'{"orderTopicConf":{}}', "orderTopicConf is not a string"),
    ],
)
def test_unreadable_routes_are_frame_errors(body: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode_topic_route("t", body)


def test_the_nesting_a_route_may_have_is_far_above_what_routes_need() -> None:
    nested = b'{"queueDatas":[]' + b',"x":' + b"[" * 62 + b"]" * 62 + b"}"
    assert decode_topic_route("t", nested).queue_datas == ()  # 64 levels: read


def test_route_missing_fields_is_an_error() -> None:
    with pytest.raises(FrameError, match="readQueueNums"):
        decode_topic_route("t", b'{"queueDatas":[{"brokerName":"b","perm":6,"writeQueueNums":1}]}')


def test_broker_without_master_is_reported() -> None:
    route = decode_topic_route(
        "t",
        b'{"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":2,"writeQueueNums":2}],'
        b'"brokerDatas":[{"brokerName":"b","cluster":"c","brokerAddrs":{1:"127.0.0.1:1"}}]}',
    )
    assert route.brokers_without_master() == ["b"]
    assert len(route.to_topic_route().readable_queues()) == 2


def test_the_zone_a_broker_registered_with_is_read_and_a_given_zone_wins() -> None:
    route = decode_topic_route(
        "t",
        b'{"queueDatas":[{"brokerName":"a","perm":6,"readQueueNums":1,"writeQueueNums":1},'
        b'{"brokerName":"b","perm":6,"readQueueNums":1,"writeQueueNums":1}],'
        b'"brokerDatas":[{"brokerName":"a","cluster":"c","brokerAddrs":{0:"127.0.0.1:1"},"zoneName":"zone-a"},'
        b'{"brokerName":"b","cluster":"c","brokerAddrs":{0:"127.0.0.1:2"}}]}',
    )
    assert route.registered_zones() == {"a": "zone-a"}
    assert {b.name: b.zone for b in route.to_topic_route().brokers} == {"a": "zone-a", "b": UNKNOWN_ZONE}
    assert route.to_topic_route({"a": "z9"}).broker_zones()["a"] == "z9"


def test_signature_is_the_one_rocketmqs_acl_hook_computes() -> None:
    # AclClientRPCHook of the 4.9.7 and 5.3.3 clients gave this Signature for the same request.
    command = replace(
        request(208, 1, {"consumerGroup": "GID_orders", "topic": "orders"}), body="body-ü".encode()
    )
    signed = sign(command, Credentials("mqbalance-client", "client-secret-0"))
    assert dict(signed.ext_fields) == {
        "consumerGroup": "GID_orders",
        "topic": "orders",
        "AccessKey": "mqbalance-client",
        "Signature": "bbwxa4hNcKr+Psl1L0m9m/zrrkg=",
    }
    assert sign(signed, Credentials("mqbalance-client", "client-secret-0")) == signed  # re-signing is stable
    assert "client-secret-0" not in repr(Credentials("mqbalance-client", "client-secret-0"))
