"""docs/architecture.md names every module of the harness and of the parts that have rooms: a module
added without a row in its package's table fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"

ROOMS = {
    "harness": "The harness's toolkit",
    "mqbalance": "Their modules",
    "mqbalance/operator": "The operator's rooms",
    "mqbalance/sidecar": "The sidecar's rooms",
}
"""Each package and the section of the doc whose tables name its modules (paths relative to it); a
package with a section of its own is left out of its parent's."""


def modules(package: str) -> list[str]:
    """The package's modules as paths relative to it; a package's ``__init__`` is its folder's."""
    root = REPO / package
    own = [REPO / other for other in ROOMS if other.startswith(f"{package}/")]
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if path.name != "__init__.py" and not any(path.is_relative_to(room) for room in own)
    )


def named_in(section: str) -> set[str]:
    """What the first column of the section's tables names in backquotes."""
    text = DOC.read_text()
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    names: set[str] = set()
    for line in text[start : end if end != -1 else None].splitlines():
        if line.startswith("| "):
            names |= set(re.findall(r"`([^`]+)`", line.split(" | ")[0]))
    return names


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_the_architecture_names_every_module(package: str) -> None:
    named = named_in(ROOMS[package])
    assert [m for m in modules(package) if m not in named] == []


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_the_architecture_names_no_module_that_is_gone(package: str) -> None:
    named = {n for n in named_in(ROOMS[package]) if n.endswith(".py")}
    assert sorted(named - set(modules(package))) == []
