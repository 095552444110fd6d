"""Cached JSON values share their keys and short strings."""

from __future__ import annotations

import json

from mqbalance.kube import compact


def test_compact_values_are_equal_and_share_their_keys_and_short_strings() -> None:
    text = '{"status": {"conditions": [{"type": "Ready", "status": "True", "message": "%s"}], "n": 1.5}}'
    long = "m" * 100
    one, two = (compact(json.loads(text % long)) for _ in range(2))
    assert one == two == json.loads(text % long)
    c1, c2 = one["status"]["conditions"][0], two["status"]["conditions"][0]
    assert isinstance(one["status"]["conditions"], list)
    assert next(iter(c1)) is next(iter(c2)), "keys are shared"
    assert c1["status"] is c2["status"], "short values are shared"
    assert c1["message"] is not c2["message"], "long values are left alone"
