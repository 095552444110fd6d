"""What the injector's tests share: the API server's side of a JSON patch."""

from __future__ import annotations

import json
from typing import Any


def apply_patch(document: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply the ``add`` operations :func:`mqbalance.injector.spec.pod_patch` emits to a copy of
    ``document``, as the API server does."""
    result = json.loads(json.dumps(document))
    for op in ops:
        if op["op"] != "add":
            raise ValueError(f"unsupported operation {op['op']!r}")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node.append(op["value"]) if last == "-" else node.insert(int(last), op["value"])
        else:
            node[last] = op["value"]
    return result
