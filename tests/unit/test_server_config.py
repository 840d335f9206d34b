"""Server settings: every limit reachable by a `serve` flag and by a --config file, flags over
the file, and bad values refused before the server starts.

The command runs with `loghub.server.serve` replaced, so what it would run with is captured
without starting anything.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import loghub.server
from loghub.cli import app
from loghub.errors import ParameterInvalid
from loghub.server.config import Limits, ServerConfig, load_config_file


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[ServerConfig]:
    configs: list[ServerConfig] = []
    monkeypatch.setattr(loghub.server, "serve", configs.append)
    return configs


def _serve(*args: str) -> int:
    return CliRunner().invoke(app, ["serve", *args]).exit_code


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Limits)])
def test_every_limit_has_a_serve_flag(field: str, captured: list[ServerConfig]) -> None:
    assert _serve(_flag(field), "7") == 0
    assert getattr(captured[0].limits, field) == 7
    others = {f.name for f in dataclasses.fields(Limits)} - {field}
    assert all(getattr(captured[0].limits, name) == getattr(Limits(), name) for name in others)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Limits)])
def test_every_limit_can_be_set_in_a_config_file(
    field: str, tmp_path: Path, captured: list[ServerConfig]
) -> None:
    config = tmp_path / "server.toml"
    config.write_text(f"{field} = 7\n")
    assert _serve("--config", str(config)) == 0
    assert getattr(captured[0].limits, field) == 7


def test_flags_override_the_config_file(tmp_path: Path, captured: list[ServerConfig]) -> None:
    config = tmp_path / "server.json"
    config.write_text(
        json.dumps(
            {
                "port": 9123,
                "idle-timeout-s": 5,
                "header_timeout_s": 3,
                "fsync": "interval",
                "public-host": ["logs.example.com"],
                "data-dir": str(tmp_path / "from-file"),
            }
        )
    )
    assert _serve("--config", str(config), "--idle-timeout-s", "7", "--port", "9124") == 0
    (server_config,) = captured
    assert server_config.port == 9124
    assert server_config.fsync_policy == "interval"
    assert server_config.limits.idle_timeout_s == 7
    assert server_config.limits.header_timeout_s == 3
    assert "logs.example.com" in server_config.base_hosts
    assert server_config.data_dir == tmp_path / "from-file"


def test_unknown_setting_in_the_config_file_is_refused(
    tmp_path: Path, captured: list[ServerConfig]
) -> None:
    config = tmp_path / "server.toml"
    config.write_text("idle_timeout = 5\n")  # the unit is missing from the name
    assert _serve("--config", str(config)) != 0
    assert not captured


def test_wrong_type_in_the_config_file_is_refused(
    tmp_path: Path, captured: list[ServerConfig]
) -> None:
    config = tmp_path / "server.toml"
    config.write_text('connections_max = "many"\n')
    assert _serve("--config", str(config)) != 0
    assert not captured


@pytest.mark.parametrize("value", ["0", "-1"])
def test_non_positive_limit_is_refused(value: str, captured: list[ServerConfig]) -> None:
    assert _serve("--body-timeout-s", value) != 0
    assert not captured


def test_limits_refuse_non_positive_values() -> None:
    with pytest.raises(ParameterInvalid):
        Limits(connections_max=0)
    with pytest.raises(ParameterInvalid):
        Limits(idle_timeout_s=-1.0)


def test_unreadable_config_file_is_a_parameter_error(tmp_path: Path) -> None:
    broken = tmp_path / "server.toml"
    broken.write_text("port = \n")
    with pytest.raises(ParameterInvalid):
        load_config_file(broken)
    with pytest.raises(ParameterInvalid):
        load_config_file(tmp_path / "missing.json")
    listed = tmp_path / "server.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ParameterInvalid):
        load_config_file(listed)


def test_body_limits_are_the_sdk_maximum() -> None:
    # the SDK refuses more than 30 MiB raw per PutLogs, and may send it uncompressed
    assert Limits().request_body_bytes_max == 30 * 1024 * 1024
    assert Limits().raw_body_bytes_max == 30 * 1024 * 1024


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Limits)])
def test_every_limit_is_in_the_configuration_table(field: str) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    rows = [line for line in docs.read_text().splitlines() if f"(`{_flag(field)}`)" in line]
    assert len(rows) == 1, f"docs/configuration.md has no Limits row for {_flag(field)}"


def test_the_kafka_address_defaults_like_advertise_and_refuses_a_malformed_one() -> None:
    base = ServerConfig(data_dir=Path("d"), host="10.0.0.1")
    assert base.kafka_address() is None  # no listener
    listening = dataclasses.replace(base, kafka_port=9092)
    assert listening.kafka_address() == ("10.0.0.1", 9092)
    named = dataclasses.replace(listening, kafka_advertised_host="logs.example.com")
    assert named.kafka_address() == ("logs.example.com", 9092)
    advertised = dataclasses.replace(named, kafka_advertise="kafka.example.com:19092")
    assert advertised.kafka_address() == ("kafka.example.com", 19092)
    for bad in ("no-port", ":9092", "h:x", "h:0", "h:70000"):
        with pytest.raises(ParameterInvalid, match="--kafka-advertise must be host:port"):
            dataclasses.replace(listening, kafka_advertise=bad).kafka_address()


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"replication_factor": 0}, "--replication-factor"),
        ({"replication_factor": 8}, "--replication-factor"),
        ({"replication_factor": 3, "min_insync_replicas": 4}, "--min-insync-replicas"),
        ({"replication_factor": 3, "min_insync_replicas": 0}, "--min-insync-replicas"),
        ({"replica_lag_ms": 50}, "--replica-lag-ms"),
    ],
)
def test_replication_flags_out_of_range_are_refused_by_name(
    changes: dict[str, int], named: str
) -> None:
    from loghub.server.config import ClusterConfig

    with pytest.raises(ParameterInvalid, match=named):
        ClusterConfig("etcd://127.0.0.1:2379", "n1", "127.0.0.1:8080", **changes)  # type: ignore[arg-type]
    ClusterConfig("etcd://127.0.0.1:2379", "n1", "127.0.0.1:8080", replication_factor=3)


def test_replication_without_a_cluster_is_refused() -> None:
    result = CliRunner().invoke(app, ["serve", "--replication-factor", "3"])
    assert result.exit_code != 0 and "--replication-factor needs --cluster" in result.output
