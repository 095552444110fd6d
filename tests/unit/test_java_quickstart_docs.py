"""clients/java/README.md's quick start is the code the Java build compiles.

The Java module compiles ``quickstart/QuickStart.java`` with its test sources (against both client
lines); this checks that the README shows exactly that code: the same imports, and each ``main``
body as one block, in order.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

JAVA = Path(__file__).resolve().parents[2] / "clients" / "java"
README = JAVA / "README.md"
SOURCE = JAVA / "src" / "test" / "java" / "io" / "mqbalance" / "rocketmq" / "quickstart" / "QuickStart.java"


def readme_blocks() -> list[str]:
    text = README.read_text()
    quick = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip("\n") for block in re.findall(r"```java\n(.*?)```", quick, re.S)]


def main_bodies(source: str) -> list[str]:
    """The bodies of every ``public static void main``, dedented."""
    bodies = []
    for match in re.finditer(r"public static void main\(String\[\] args\) throws Exception \{\n", source):
        lines = []
        for line in source[match.end() :].splitlines():
            if line == "        }":  # the method's closing brace, at its indentation
                break
            lines.append(line)
        bodies.append(textwrap.dedent("\n".join(lines)).strip("\n"))
    return bodies


def test_the_readme_shows_the_imports_the_quick_start_compiles_with() -> None:
    imports = [line for line in SOURCE.read_text().splitlines() if line.startswith("import ")]
    assert readme_blocks()[0].splitlines() == imports


def test_each_readme_block_is_one_main_of_the_compiled_quick_start() -> None:
    bodies = main_bodies(SOURCE.read_text())
    assert len(bodies) == 4
    assert readme_blocks()[1:] == bodies
