"""The operator's and the injector's listener options, and the operator's metrics listener under them (the
sidecar's: tests/unit/sidecar/test_sidecar_config.py and tests/integration/reliability/
test_reliability_listeners.py)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from harness.polling import scaled
from mqbalance.injector.main import parse_args as injector_args
from mqbalance.listener import Limits
from mqbalance.operator.main import parse_args as operator_args
from mqbalance.operator.metrics import create_app, serve

INJECTOR = ["--namespace=mq", "--secret=tls", "--webhook-config=hook", "--hosts=mq-injector.mq.svc"]


def test_the_operator_takes_address_lists_and_limits() -> None:
    config = operator_args(
        ["-A", "--metrics-host=$(POD_IP),127.0.0.1", "--max-connections=16", "--read-timeout=5"]
    )
    assert config.metrics_host == "$(POD_IP),127.0.0.1"  # as the chart writes it; the kubelet expands it
    assert config.limits == Limits(max_connections=16, read_timeout=5)
    assert operator_args(["-A"]).limits == Limits()


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--metrics-host=10.1.2.3,"], "--metrics-host"),
        (["--external-metrics-host="], "--external-metrics-host"),
        (["--idle-timeout=0"], "--idle-timeout"),
    ],
)
def test_the_operator_refuses_bad_listener_options(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        operator_args(["-A", *argv])
    assert complaint in capsys.readouterr().err


def test_the_injector_takes_address_lists_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    config = injector_args([*INJECTOR, "--host=$(POD_IP)", "--max-connections=32"])
    assert (config.host, config.limits) == ("$(POD_IP)", Limits(max_connections=32))
    with pytest.raises(SystemExit):
        injector_args([*INJECTOR, "--read-timeout=never"])
    assert "--read-timeout" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_the_operators_metrics_listener_keeps_the_newest_connections_up_to_its_cap() -> None:
    app = create_app(CollectorRegistry(), lambda: {"groups": 0})
    runner = await serve(app, 0, "127.0.0.1", Limits(max_connections=8))
    try:
        port = runner.addresses[0][1]
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        for reader, _ in conns[:12]:
            assert await asyncio.wait_for(reader.read(), scaled(10)) == b""
        for reader, writer in conns[12:]:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await asyncio.wait_for(reader.readline(), scaled(10))).startswith(b"HTTP/1.1 200")
            writer.close()
    finally:
        await runner.cleanup()
