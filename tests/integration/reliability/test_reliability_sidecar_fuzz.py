"""Fuzz the sidecar's HTTP API from its OpenAPI document with schemathesis: no 5xx, and every
answer matches the document (status codes, content types, bodies).

The sidecar runs as a process with a file-based assignment (no API server needed); the same
handlers serve when it watches the API.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sidecar_process import SidecarProcess

from mqbalance.document import AssignmentDocument
from mqbalance.model import MessageQueue

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    ]
)


def document() -> AssignmentDocument:
    return AssignmentDocument(
        group="orders-consumer",
        generation=3,
        strategy="STICKY",
        message_model="CLUSTERING",
        computed_at=0.0,
        reason="initial",
        members={"pod-a": "zone-a", "pod-b": "zone-b"},
        topics={
            "orders": {
                "pod-a": tuple(MessageQueue("orders", "broker-a", i) for i in (0, 2)),
                "pod-b": tuple(MessageQueue("orders", "broker-a", i) for i in (1, 3)),
            }
        },
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
        "--max-wait=1",
    )
    side.start()
    try:
        result = subprocess.run(
            [
                str(st),
                "run",
                f"http://127.0.0.1:{side.port}/openapi.json",
                f"--checks={CHECKS}",
                f"--max-examples={max_examples}",
                "--seed=1",
                "--request-timeout=5",
            ],
            capture_output=True,
            text=True,
            timeout=600,
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


def test_sidecar_api_survives_fuzzing(tmp_path: Path) -> None:
    cases = fuzz(tmp_path, 50)
    print(f"fuzz figures: cases={cases}")


@pytest.mark.slow
def test_sidecar_api_survives_long_fuzzing(tmp_path: Path) -> None:
    cases = fuzz(tmp_path, 1000)
    print(f"fuzz figures: cases={cases}")
