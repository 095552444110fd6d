"""The sidecar's Python client without the heavy dependencies, and ``$MQBALANCE_URL``.

``pip install mqbalance`` (no extras) must give a working ``mqbalance.sidecar.client``:
it is imported here in a child interpreter started with ``-S`` (no site-packages at all, so
aiohttp, kopf, kubernetes and prometheus-client cannot be imported even by accident), and in
one with the virtualenv's site-packages, checking that importing it loads none of them. Without
site-packages, ``mqbalance allocate`` still runs and the commands that need an extra name it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mqbalance.sidecar.client import DEFAULT_URL, URL_ENV, SidecarClient, default_url

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("aiohttp", "kopf", "kubernetes", "prometheus_client", "yaml", "pyspark", "pandas", "pyarrow")

LOADED = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import mqbalance.sidecar.client as client
from mqbalance.sidecar.client import SidecarClient, SidecarError
import mqbalance.sidecar.drain
print(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})))
print(SidecarClient().base_url)
"""


def run(
    *args: str, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def clean_env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1", **extra}


def test_without_site_packages_aiohttp_is_really_absent() -> None:
    # The check below means something only if -S hides the virtualenv's packages.
    result = run("-S", "-c", "import aiohttp", env=clean_env())
    assert result.returncode != 0
    assert "ModuleNotFoundError" in result.stderr


def test_the_client_imports_with_the_standard_library_only() -> None:
    result = run("-S", "-c", LOADED, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", DEFAULT_URL]


def test_importing_the_client_loads_no_heavy_dependency() -> None:
    # With site-packages (everything installed): still nothing heavy is imported.
    result = run("-c", LOADED, env=clean_env(MQBALANCE_URL="http://127.0.0.1:18081/"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "http://127.0.0.1:18081"]


def test_allocate_runs_without_extras() -> None:
    request = '{"strategy": "AVG", "queues": [["b", 0], ["b", 1]], "consumers": ["c1", "c2"]}'
    allocated = run("-S", "-m", "mqbalance", "allocate", env=clean_env(), input=request)
    assert allocated.returncode == 0, allocated.stderr
    assert '"assignment"' in allocated.stdout


@pytest.mark.parametrize("command", ["operator", "sidecar", "injector"])
def test_without_its_extra_a_command_names_it(command: str) -> None:
    missing = run("-S", "-m", "mqbalance", command, "--help", env=clean_env())
    assert missing.returncode == 2, missing.stderr
    assert f"pip install 'mqbalance[{command}]'" in missing.stderr


def test_default_url_reads_mqbalance_url() -> None:
    assert default_url({}) == DEFAULT_URL
    assert default_url({URL_ENV: ""}) == DEFAULT_URL
    assert default_url({URL_ENV: "  "}) == DEFAULT_URL
    assert default_url({URL_ENV: " http://10.0.0.7:9000 "}) == "http://10.0.0.7:9000"


def test_the_no_argument_client_follows_the_environment_and_an_argument_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    assert SidecarClient().base_url == DEFAULT_URL
    monkeypatch.setenv(URL_ENV, "http://127.0.0.1:18081/")
    assert SidecarClient().base_url == "http://127.0.0.1:18081"
    assert SidecarClient(group="orders").base_url == "http://127.0.0.1:18081"
    assert SidecarClient("http://127.0.0.1:8082").base_url == "http://127.0.0.1:8082"
