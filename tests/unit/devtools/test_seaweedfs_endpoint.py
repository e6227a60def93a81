"""The benchmarks' compiled S3 endpoint (devtools/services.py, kind="seaweedfs"), without its binary."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from airflow_provider_speculative.devtools import services

ACCESS, SECRET = "AKIATESTKEY0000001", "s3cr3t-never-on-a-command-line"


def _ports() -> dict[str, int]:
    return {name: 20000 + i for i, name in enumerate(services._SEAWEEDFS_PORTS)}


def test_config_holds_the_key_pair_for_an_identity_allowed_everything_and_only_its_owner_reads_it(
        tmp_path: Path) -> None:
    path = services.write_seaweedfs_config(tmp_path, ACCESS, SECRET)

    (identity,) = json.loads(path.read_text())["identities"]
    assert identity["credentials"] == [{"accessKey": ACCESS, "secretKey": SECRET}]
    assert {"Admin", "Read", "List", "Write"} <= set(identity["actions"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_command_line_has_no_key_and_every_listener_on_its_own_loopback_port(tmp_path: Path) -> None:
    config = tmp_path / "s3-identities.conf"
    argv = services.seaweedfs_argv(Path("/opt/weed"), tmp_path, config, _ports())

    assert not any(ACCESS in arg or SECRET in arg for arg in argv)
    assert f"-s3.config={config}" in argv
    assert "-ip.bind=127.0.0.1" in argv and "-ip=127.0.0.1" in argv
    ports = [arg.split("=", 1)[1] for arg in argv if arg.split("=", 1)[0][1:] in services._SEAWEEDFS_PORTS]
    assert len(ports) == len(services._SEAWEEDFS_PORTS) == len(set(ports))
    # Listeners with fixed default ports that nothing here uses are switched off.
    assert {"-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"} <= set(argv)
    assert f"-dir={tmp_path / 'data'}" in argv


def test_sockets_weed_makes_in_tmp_follow_the_grpc_ports() -> None:
    ports = _ports()

    assert services.seaweedfs_sockets(ports) == tuple(
        Path(f"/tmp/seaweedfs-{name}-grpc-{ports[f'{name}.port.grpc']}.sock")
        for name in ("master", "volume", "filer", "s3"))


def test_missing_binary_names_the_make_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(services.WEED_ENV, str(tmp_path / "weed"))

    with pytest.raises(services.ServiceUnavailable, match="make s3-compiled"):
        services.start_s3(kind="seaweedfs")


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="minio"):
        services.start_s3(kind="minio")
