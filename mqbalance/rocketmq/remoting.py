"""RocketMQ's remoting protocol: frames, commands and fastjson bodies.

Pure code, no I/O: bytes in, values out (the asyncio client is
:mod:`mqbalance.rocketmq.nameserver`). Everything here follows RocketMQ's own classes
(``org.apache.rocketmq.remoting.protocol.RemotingCommand``), 4.x and 5.x alike. The routes those
bodies carry are :mod:`mqbalance.rocketmq.route`.

A frame is::

    int32 length            bytes that follow: 4 + header length + body length
    int32 type_and_length   serialize type in the high byte, header length in the low 3 bytes
    header                  JSON (type 0) or RocketMQ's binary header (type 1)
    body                    the rest

Bodies are written by fastjson. Before RocketMQ 4.9.4 (and for clients that announce an older
version) a NameServer writes non-standard JSON: maps keyed by integers keep their keys
unquoted (``"brokerAddrs":{0:"127.0.0.1:10911"}``). :func:`parse_fastjson` reads both.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mqbalance.json_limits import JsonError, TooDeep, loads, text_of


class RequestCode(enum.IntEnum):
    """Request codes (org.apache.rocketmq.remoting.protocol.RequestCode) used here."""

    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106


class ResponseCode(enum.IntEnum):
    """Response codes (ResponseCode / RemotingSysResponseCode) a client must tell apart."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TOPIC_NOT_EXIST = 17
    NO_PERMISSION = 16
    QUERY_NOT_FOUND = 22
    """The group has committed no offset for the queue."""


class SerializeType(enum.IntEnum):
    JSON = 0
    ROCKETMQ = 1


FLAG_RESPONSE = 1
"""RemotingCommand's RPC_TYPE bit: set on responses."""
FLAG_ONEWAY = 2

MAX_FRAME = 16 * 1024 * 1024
"""RocketMQ's default ``com.rocketmq.remoting.frameMaxLength``; longer frames are refused."""

VERSION_5_3_3 = 479
"""MQVersion.Version.V5_3_3.ordinal(): the version this client announces. Any version from
V4_9_4 (401) on makes a NameServer answer with standard JSON."""

_LANGUAGES = (
    "JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
    "RUST", "NODE_JS",
)  # fmt: skip
"""LanguageCode in declaration order: the binary header carries the ordinal."""


class FrameError(ValueError):
    """Bytes that are not a RocketMQ remoting frame (or a body that is not what it should be)."""


@dataclass(frozen=True)
class RemotingCommand:
    """One request or response (RocketMQ's RemotingCommand)."""

    code: int
    opaque: int = 0
    flag: int = 0
    ext_fields: Mapping[str, str] = field(default_factory=dict)
    remark: str | None = None
    body: bytes = b""
    language: str = "PYTHON"
    version: int = VERSION_5_3_3
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)


def request(code: int, opaque: int, ext_fields: Mapping[str, object] | None = None) -> RemotingCommand:
    """A request command; field values are sent as strings, as RocketMQ's headers are."""
    fields = {k: _field_text(v) for k, v in (ext_fields or {}).items() if v is not None}
    return RemotingCommand(code=int(code), opaque=opaque, ext_fields=fields)


def _field_text(value: object) -> str:
    if isinstance(value, bool):  # Java's Boolean.toString
        return "true" if value else "false"
    return str(value)


ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
"""The ext fields of RocketMQ's ``AclClientRPCHook`` (``SessionCredentials``)."""


@dataclass(frozen=True)
class Credentials:
    """An ACL account: RocketMQ's ``SessionCredentials`` (4.x plain ACL; a user of 5.x ACL 2.0)."""

    access_key: str
    secret_key: str = field(repr=False)


def sign(command: RemotingCommand, credentials: Credentials) -> RemotingCommand:
    """``command`` signed as RocketMQ's ``AclClientRPCHook`` signs a request (4.9.x and 5.x alike).

    The hook adds ``AccessKey`` to the ext fields, then signs the values of all ext fields sorted
    by name, followed by the body, with HmacSHA1 keyed by the secret key, base64-encoded, into
    ``Signature``; a 4.x ``PlainAccessValidator`` and a 5.x ``DefaultAuthenticationContextBuilder``
    recompute it the same way from the fields they receive.
    """
    fields = {k: v for k, v in command.ext_fields.items() if k != SIGNATURE}
    fields[ACCESS_KEY] = credentials.access_key
    content = "".join(fields[k] for k in sorted(fields)).encode() + command.body
    digest = hmac.new(credentials.secret_key.encode(), content, hashlib.sha1).digest()
    fields[SIGNATURE] = base64.b64encode(digest).decode()
    return replace(command, ext_fields=fields)


def encode(command: RemotingCommand) -> bytes:
    """The frame for ``command``, header in its serialize type."""
    if command.serialize_type == SerializeType.JSON:
        header = _encode_json_header(command)
    else:
        header = _encode_binary_header(command)
    if len(header) > 0xFFFFFF:
        raise FrameError(f"header of {len(header)} bytes does not fit the 24-bit length field")
    length = 4 + len(header) + len(command.body)
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    return (
        struct.pack(">iI", length, (int(command.serialize_type) << 24) | len(header)) + header + command.body
    )


def _encode_json_header(command: RemotingCommand) -> bytes:
    document: dict[str, Any] = {
        "code": command.code,
        "flag": command.flag,
        "language": command.language,
        "opaque": command.opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": command.version,
    }
    if command.ext_fields:
        document["extFields"] = dict(command.ext_fields)
    if command.remark is not None:
        document["remark"] = command.remark
    return json.dumps(document, separators=(",", ":")).encode()


def _encode_binary_header(command: RemotingCommand) -> bytes:
    language = (
        _LANGUAGES.index(command.language) if command.language in _LANGUAGES else _LANGUAGES.index("OTHER")
    )
    remark = (command.remark or "").encode()
    ext = b"".join(
        struct.pack(">H", len(k.encode())) + k.encode() + struct.pack(">i", len(v.encode())) + v.encode()
        for k, v in command.ext_fields.items()
    )
    return (
        struct.pack(">hBhii", command.code, language, command.version, command.opaque, command.flag)
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(ext))
        + ext
    )


def frame_length(prefix: bytes) -> int:
    """Bytes that follow a frame's 4-byte length prefix; checked against :data:`MAX_FRAME`."""
    if len(prefix) != 4:
        raise FrameError(f"a frame starts with a 4-byte length, got {len(prefix)} bytes")
    (length,) = struct.unpack(">i", prefix)
    if length < 4 or length > MAX_FRAME:
        raise FrameError(f"frame length {length} outside 4..{MAX_FRAME}: not a RocketMQ remoting peer?")
    return int(length)


def decode(frame: bytes) -> RemotingCommand:
    """One whole frame (with its length prefix) to a command."""
    length = frame_length(frame[:4])
    if len(frame) != 4 + length:
        raise FrameError(f"frame announces {length} bytes after its prefix but {len(frame) - 4} follow")
    return decode_payload(frame[4:])


def decode_payload(payload: bytes) -> RemotingCommand:
    """A frame without its length prefix (what a stream reader hands over) to a command."""
    if len(payload) < 4:
        raise FrameError(f"a frame holds at least its 4-byte header length, got {len(payload)} bytes")
    (type_and_length,) = struct.unpack(">I", payload[:4])
    serialize = type_and_length >> 24
    header_length = type_and_length & 0xFFFFFF
    if 4 + header_length > len(payload):
        raise FrameError(f"header length {header_length} exceeds the frame ({len(payload) - 4} bytes)")
    header = payload[4 : 4 + header_length]
    body = payload[4 + header_length :]
    if serialize == SerializeType.JSON:
        return _decode_json_header(header, body)
    if serialize == SerializeType.ROCKETMQ:
        return _decode_binary_header(header, body)
    raise FrameError(f"unknown serialize type {serialize} (0 is JSON, 1 is RocketMQ's binary header)")


def _decode_json_header(header: bytes, body: bytes) -> RemotingCommand:
    try:
        document = loads(header)
    except JsonError as exc:
        raise FrameError(f"header is not JSON: {exc}: {header[:200]!r}") from None
    if not isinstance(document, dict) or not isinstance(document.get("code"), int):
        raise FrameError(f"header has no integer code: {header[:200]!r}")
    ext = document.get("extFields") or {}
    remark = document.get("remark")
    if not isinstance(ext, dict) or not isinstance(remark, str | None):
        raise FrameError(f"extFields is not an object or remark not a string: {header[:200]!r}")
    try:
        return RemotingCommand(
            code=document["code"],
            opaque=int(document.get("opaque", 0)),
            flag=int(document.get("flag", 0)),
            ext_fields={str(k): str(v) for k, v in ext.items()},
            remark=remark,
            body=body,
            language=str(document.get("language", "JAVA")),
            version=int(document.get("version", 0)),
            serialize_type=SerializeType.JSON,
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameError(f"header mistypes a field ({exc}): {header[:200]!r}") from None


def _decode_binary_header(header: bytes, body: bytes) -> RemotingCommand:
    try:
        code, language, version, opaque, flag = struct.unpack_from(">hBhii", header, 0)
        pos = 13
        (remark_length,) = struct.unpack_from(">i", header, pos)
        pos += 4
        remark = _field(header, pos, remark_length).decode() if remark_length > 0 else None
        pos += max(remark_length, 0)
        (ext_length,) = struct.unpack_from(">i", header, pos)
        pos += 4
        end = pos + ext_length
        ext: dict[str, str] = {}
        while pos < end:
            (key_length,) = struct.unpack_from(">H", header, pos)
            pos += 2
            key = _field(header, pos, key_length).decode()
            pos += key_length
            (value_length,) = struct.unpack_from(">i", header, pos)
            pos += 4
            ext[key] = _field(header, pos, value_length).decode()
            pos += value_length
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"malformed RocketMQ binary header: {exc}") from None
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        ext_fields=ext,
        remark=remark,
        body=body,
        language=_LANGUAGES[language] if language < len(_LANGUAGES) else "OTHER",
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


def _field(header: bytes, pos: int, length: int) -> bytes:
    """``length`` bytes at ``pos``; a negative length or one past the header's end is refused (a
    negative one would walk the position back: the loop above would never end)."""
    if length < 0 or pos + length > len(header):
        raise struct.error(f"field of {length} bytes at {pos} outside the {len(header)}-byte header")
    return header[pos : pos + length]


# -- fastjson bodies ----------------------------------------------------------------------------


def parse_fastjson(data: bytes | str) -> Any:
    """Parse a body written by fastjson, standard JSON or not; FrameError for anything else
    (not UTF-8, not JSON, nested deeper than :data:`~mqbalance.json_limits.MAX_DEPTH`).

    fastjson leaves integer map keys unquoted (``{0:"addr"}``) unless told otherwise; they are
    quoted here before parsing, outside string literals only.
    """
    try:
        text = text_of(data)
    except JsonError as exc:
        raise FrameError(f"body is {exc}") from None
    try:
        return loads(text)
    except TooDeep as exc:
        raise FrameError(f"body is {exc}") from None
    except JsonError:
        pass  # perhaps fastjson's bare keys
    try:
        return loads("".join(_quote_bare_keys(text)))
    except JsonError as exc:
        raise FrameError(f"body is not JSON, even as fastjson writes it: {exc}: {text[:200]!r}") from None


def _quote_bare_keys(text: str) -> Iterator[str]:
    i, n = 0, len(text)
    expect_key = False  # just after '{' or ',' (a key may follow inside an object)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            yield text[i : j + 1]
            i = j + 1
            expect_key = False
            continue
        if expect_key and (c == "-" or c.isdigit()):
            j = i + 1
            while j < n and (text[j].isdigit() or text[j] in ".eE+-"):
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            token = text[i:j]
            yield f'"{token}"' if k < n and text[k] == ":" else token
            i = j
            expect_key = False
            continue
        if c in "{,":
            expect_key = True
        elif c not in " \t\r\n":
            expect_key = False
        yield c
        i += 1
