"""Fuzz the sidecar's HTTP API from its OpenAPI document with schemathesis: no 5xx, every answer
matches the document (status codes, content types, bodies), and every request the document calls
valid is accepted (positive_data_acceptance: no 400 for schema-valid data).

The sidecar runs as a process with a file-based assignment (no API server needed); the same
handlers serve when it watches the API.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from harness.apps.sidecar import SidecarProcess
from harness.polling import scaled, work_timeout
from mqbalance.contract import AssignmentDocument
from tests.unit.sidecar import sidecar_support

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
        "positive_data_acceptance",
    ]
)
MAX_WAIT = 30
"""The fuzzed sidecar's --max-wait. Not below the default long-poll timeout (30 s), which the
sidecar refuses with 400 when it exceeds --max-wait although the client gave no timeout."""
GENERATION = 982_451_653
"""Far from the small integers fuzzers favour, so a long-poll's ``after`` rarely matches it and
waits; one that does returns within MAX_WAIT."""


def document() -> AssignmentDocument:
    held = {"pod-a": [("broker-a", 0), ("broker-a", 2)], "pod-b": [("broker-a", 1), ("broker-a", 3)]}
    return sidecar_support.document(
        GENERATION, {"orders": held}, reason="initial", zones={"pod-a": "zone-a", "pod-b": "zone-b"}
    )


def fuzz(tmp_path: Path, max_examples: int) -> int:
    st = Path(sys.executable).with_name("st")
    if not st.exists():
        st = Path(shutil.which("st") or "st")
    assignment = tmp_path / "assignment.json"
    assignment.write_text(document().encode())
    side = SidecarProcess(
        tmp_path / "no-kubeconfig",
        tmp_path / "sidecar.log",
        "--pod-name=pod-a",
        "--namespace=shop",
        "--group=orders-consumer",
        f"--assignment-file=orders-consumer={assignment}",
        "--no-topics",
        f"--max-wait={MAX_WAIT}",
    )
    side.start()
    try:
        schema = served_schema(side.port, tmp_path / "openapi.json")
        result = subprocess.run(
            [
                str(st),
                "run",
                str(schema),
                f"--url=http://127.0.0.1:{side.port}",
                f"--checks={CHECKS}",
                f"--max-examples={max_examples}",
                "--seed=1",
                # A long-poll may take MAX_WAIT; the answer after it, a busy machine's while.
                f"--request-timeout={MAX_WAIT + scaled(5):.0f}",
            ],
            capture_output=True,
            text=True,
            # Most examples answer at once; a few long-polls wait up to MAX_WAIT each.
            timeout=scaled(work_timeout(600, 0.5, max_examples)),
            check=False,
        )
        assert side.returncode is None, f"the sidecar died:\n{side.tail()}"
    finally:
        side.stop()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    found = re.search(r"(\d+) generated, (\d+) passed", output)
    assert found, output[-2000:]
    assert found.group(1) == found.group(2), output[-2000:]
    log = side.tail(100_000)
    # aiohttp's parser logs the malformed requests it answers 400 (a NUL in a header); nothing else may fail.
    blocks = log.split("Traceback (most recent call last):")[1:]
    unexpected = [b for b in blocks if "BadHttpMessage" not in b.split("\n2", 1)[0]]
    assert not unexpected, unexpected[0][:2000]
    assert " ERROR mqbalance" not in log, log
    return int(found.group(1))


def served_schema(port: int, path: Path) -> Path:
    """The document the sidecar serves, with the long-poll timeout bounded by this sidecar's --max-wait.

    The document states the default bound (300 s); a sidecar started with a smaller --max-wait
    refuses longer timeouts with 400, which positive_data_acceptance would count as a failure.
    """
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=5) as resp:
        doc = json.load(resp)
    bounded = 0
    for item in doc["paths"].values():
        for op in item.values():
            for param in op.get("parameters", []):
                schema = param["schema"]
                timeout = (
                    schema if param["name"] == "timeout" else schema.get("properties", {}).get("timeout")
                )
                if timeout is not None:
                    assert timeout["maximum"] == 300, timeout
                    timeout["maximum"] = MAX_WAIT
                    bounded += 1
    assert bounded == 3, "expected the timeouts of /v1/queues, /v1/assignment and /v1/drain"
    path.write_text(json.dumps(doc))
    return path


def test_sidecar_api_survives_fuzzing(tmp_path: Path) -> None:
    cases = fuzz(tmp_path, 50)
    print(f"fuzz figures: cases={cases}")


@pytest.mark.slow
def test_sidecar_api_survives_long_fuzzing(tmp_path: Path) -> None:
    cases = fuzz(tmp_path, 1000)
    print(f"fuzz figures: cases={cases}")
