"""JSON from other processes (NameServers, brokers, the documents in ConfigMaps), parsed with a
bound on its nesting.

Python's json parser recurses once per level: ``[[[[...`` a thousand deep raises RecursionError
from inside it, and a value some hundreds deep that does parse still breaks what walks it
recursively later (``repr``, ``str``, ``json.dumps``). Nothing these readers take nests more than
a handful of levels (a route 4, an assignment document 5), so a value nested deeper than
:data:`MAX_DEPTH` is refused. Whatever else json refuses (bytes that are not UTF-8, text that is
not JSON, a number longer than ``int`` takes) comes out as a :class:`JsonError` too, a ValueError.

json's C parser meets a deep text first, and raises RecursionError within a thousand levels,
at once; a value that parsed is then walked level by level (without recursion), which costs about
what parsing it did, and only when its text holds more brackets than the limit.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64
"""Arrays and objects nested deeper than this are refused."""


class JsonError(ValueError):
    """Text that is not JSON these readers take: not UTF-8, not JSON, or nested too deep."""


class TooDeep(JsonError):
    """JSON nested deeper than the limit."""


def text_of(data: str | bytes) -> str:
    """``data`` as text: bytes must be UTF-8."""
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JsonError(f"not UTF-8: {e}") from None


def loads(data: str | bytes, limit: int = MAX_DEPTH) -> Any:
    """``data`` parsed as JSON nested at most ``limit`` deep; JsonError otherwise."""
    text = text_of(data)
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested deeper than {limit} levels") from None
    except ValueError as e:  # not JSON, or a number longer than int() takes
        raise JsonError(str(e)) from None
    if text.count("[") + text.count("{") > limit:  # else it cannot be that deep: no walk
        check_depth(value, limit)
    return value


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """TooDeep when the lists and dicts of a parsed ``value`` nest deeper than ``limit``; walked a
    level at a time, without recursion."""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        below: list[Any] = []
        for node in level:
            children = node.values() if isinstance(node, dict) else node
            below += [c for c in children if isinstance(c, dict | list)]
        if not below:
            return
        level = below
    raise TooDeep(f"nested deeper than {limit} levels")
