"""The core library stays free of Kubernetes, HTTP and Spark (style.md: pure core, I/O at the edges)."""

from __future__ import annotations

import ast
from pathlib import Path

import mqbalance

FORBIDDEN = ("kubernetes", "kopf", "aiohttp", "pyspark", "pandas", "pyarrow", "prometheus_client")
# No network I/O in the core either (the remoting codec is bytes in, values out).
FORBIDDEN_IO = ("socket", "asyncio", "ssl", "urllib", "http")
# Parts of the package that are edges, not core.
EDGES = ("operator", "sidecar", "pipeline")
ROOT = Path(mqbalance.__file__).parent


def core_files() -> list[Path]:
    return [path for path in ROOT.rglob("*.py") if path.relative_to(ROOT).parts[0] not in EDGES]


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_files_are_found() -> None:
    names = {p.name for p in core_files()}
    assert {"model.py", "document.py", "journal.py"} <= names


def test_core_imports_no_edge_libraries() -> None:
    offenders = []
    for path in core_files():
        for name in imported_names(path):
            top = name.split(".")[0]
            edge = name.startswith("mqbalance.") and name.split(".")[1] in EDGES
            if top in FORBIDDEN or top in FORBIDDEN_IO or edge:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []
