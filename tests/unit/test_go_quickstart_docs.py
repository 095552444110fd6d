"""clients/go/README.md's quick start is the program the Go build compiles.

hack/build-go-client.sh vets and builds every package of clients/go, ``examples/quickstart`` among
them; this checks that the README shows exactly that program.
"""

from __future__ import annotations

import re
from pathlib import Path

GO = Path(__file__).resolve().parents[2] / "clients" / "go"


def test_the_readme_quick_start_is_the_compiled_example() -> None:
    quick = (GO / "README.md").read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```go\n(.*?)```", quick, re.S)
    assert len(blocks) == 1
    assert blocks[0] == (GO / "examples" / "quickstart" / "main.go").read_text()
