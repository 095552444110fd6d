"""JSON values as caches should keep them: one string per distinct key and short value.

``json.loads`` makes a new string for every key and value of every object it decodes (it
shares keys only within one document), so thousands of cached objects of one kind each carry
their own "lastTransitionTime", "observedGeneration", "True", "zone-a"... Interned strings are
shared by every object that names them and freed with the last one (CPython's interned strings
are not immortal).
"""

from __future__ import annotations

import sys
from typing import Any

SHARED_VALUE_LENGTH = 64
"""Longer string values (messages, documents) are rarely repeated: not worth the lookup."""


def compact(value: Any) -> Any:
    """``value`` (decoded JSON) rebuilt with its keys and short strings interned; same types, equal."""
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= SHARED_VALUE_LENGTH:
        return sys.intern(value)
    return value
