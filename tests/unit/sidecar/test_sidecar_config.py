"""Sidecar settings from options and the pod's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqbalance.listener_limits import Limits
from mqbalance.producer import Generation
from mqbalance.sidecar.config import ConfigError, FaultTable, parse_config

ENV = {"POD_NAME": "orders-abc", "POD_NAMESPACE": "shop", "MQBALANCE_GROUP": "orders"}


def test_defaults_come_from_the_downward_api_environment() -> None:
    config = parse_config([], ENV)
    assert (config.pod_name, config.namespace, config.groups) == ("orders-abc", "shop", ("orders",))
    assert (config.host, config.port, config.metrics_port) == ("127.0.0.1", 8081, 9091)
    assert config.fault_table is FaultTable.V5
    assert config.fault_tolerance is False
    assert config.uses_api


def test_options_win_over_the_environment() -> None:
    config = parse_config(
        ["--group", "a,b", "--group", "c", "--port", "9000", "--fault-table", "4.x", "--fault-tolerance"],
        {**ENV, "MQBALANCE_ZONE": "zone-a"},
    )
    assert config.groups == ("a", "b", "c")
    assert config.port == 9000
    assert config.zone == "zone-a"
    assert config.fault_table.generation is Generation.V4
    assert config.fault_tolerance


def test_listener_limits_and_addresses_from_the_environment() -> None:
    defaults = parse_config([], ENV)
    assert defaults.limits == Limits(max_connections=512)
    assert defaults.metrics_limits == Limits(max_connections=16)
    env = {**ENV, "MQBALANCE_METRICS_HOST": "10.1.2.3,127.0.0.1", "MQBALANCE_MAX_CONNECTIONS": "16"}
    config = parse_config(["--idle-timeout", "30", "--metrics-max-connections", "8"], env)
    assert config.metrics_host == "10.1.2.3,127.0.0.1"
    assert config.limits == Limits(max_connections=16, idle_timeout=30)
    assert config.metrics_limits == Limits(max_connections=8, idle_timeout=30)


def test_assignment_files_name_their_group_when_there_are_several() -> None:
    one = parse_config(["--assignment-file", "/etc/mq/assignment.json", "--no-topics"], ENV)
    assert one.assignment_files == {"orders": Path("/etc/mq/assignment.json")}
    assert not one.uses_api
    two = parse_config(["--assignment-file", "b=/x.json"], {**ENV, "MQBALANCE_GROUP": "a,b"})
    assert two.assignment_files == {"b": Path("/x.json")}
    assert two.uses_api


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        ([], {**ENV, "POD_NAME": ""}, "POD_NAME"),
        ([], {**ENV, "POD_NAMESPACE": ""}, "POD_NAMESPACE"),
        ([], {**ENV, "MQBALANCE_GROUP": " , "}, "MQBALANCE_GROUP"),
        (["--group", "a,a"], ENV, "twice"),
        (["--port", "http"], ENV, "--port"),
        (["--port", "0"], ENV, "--port"),
        (["--metrics-port", "70000"], ENV, "--metrics-port"),
        (["--fault-table", "6x"], ENV, "4x or 5x"),
        (["--max-wait", "-3"], ENV, "--max-wait"),
        (["--assignment-file", "/x.json"], {**ENV, "MQBALANCE_GROUP": "a,b"}, "GROUP=PATH"),
        (["--assignment-file", "zz=/x.json"], ENV, "'zz'"),
        (["--metrics-host", "10.1.2.3,"], ENV, "--metrics-host"),
        (["--max-connections", "0"], ENV, "--max-connections"),
        (["--metrics-max-connections", "lots"], ENV, "--metrics-max-connections"),
        ([], {**ENV, "MQBALANCE_METRICS_MAX_CONNECTIONS": "0"}, "--metrics-max-connections"),
        ([], {**ENV, "MQBALANCE_READ_TIMEOUT": "soon"}, "--read-timeout"),
    ],
)
def test_bad_settings_name_the_option(argv: list[str], env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        parse_config(argv, env)
