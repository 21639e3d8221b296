"""Server discovery: config, environment and the launcher's name record, in that order."""

import pytest

from areal.config import ExperimentConfig
from areal.infra import discovery


def cfg_with(tmp_path, **rollout):
    return ExperimentConfig.model_validate({"cluster": {"fileroot": str(tmp_path)}, "rollout": rollout})


def test_record_roundtrip_and_format(tmp_path):
    path = discovery.write_server_addrs(tmp_path, ["http://127.0.0.1:30000/", "node1:30001"])
    assert path == tmp_path / "name_resolve" / "servers.json"
    assert path.read_text() == '{"addrs": ["127.0.0.1:30000", "node1:30001"]}'
    assert discovery.read_server_addrs(tmp_path) == ["127.0.0.1:30000", "node1:30001"]
    discovery.clear_server_addrs(tmp_path)
    assert discovery.read_server_addrs(tmp_path) == []


def test_bad_records_and_addresses_fail_clearly(tmp_path):
    discovery.record_path(tmp_path).parent.mkdir(parents=True)
    discovery.record_path(tmp_path).write_text('["a:1"]')
    with pytest.raises(ValueError, match='"addrs"'):
        discovery.read_server_addrs(tmp_path)
    with pytest.raises(ValueError, match="host:port"):
        discovery.normalize_addrs(["localhost"])


def test_precedence(tmp_path):
    cfg = cfg_with(tmp_path)
    run_dir = tmp_path / "areal" / "trial0"
    assert discovery.discover_server_addrs(cfg, environ={})[0] == []
    discovery.write_server_addrs(run_dir, ["h:3"])
    assert discovery.discover_server_addrs(cfg, environ={}) == (["h:3"], str(run_dir / "name_resolve" / "servers.json"))
    assert discovery.discover_server_addrs(cfg, environ={"AREAL_SERVER_ADDRS": "h:2, h:4"}) == (
        ["h:2", "h:4"],
        "$AREAL_SERVER_ADDRS",
    )
    cfg = cfg_with(tmp_path, server_addrs=["h:1"])
    assert discovery.discover_server_addrs(cfg, environ={"AREAL_SERVER_ADDRS": "h:2"}) == (
        ["h:1"],
        "rollout.server_addrs",
    )


def test_record_root_override(tmp_path):
    cfg = ExperimentConfig.model_validate({"cluster": {"name_resolve": {"record_root": str(tmp_path / "shared")}}})
    discovery.write_server_addrs(discovery.record_root_of(cfg), ["h:9"])
    assert discovery.discover_server_addrs(cfg, environ={})[0] == ["h:9"]


def test_served_weights_record(tmp_path):
    assert discovery.read_served_weights(tmp_path) is None
    path = discovery.write_served_weights(tmp_path, "/runs/x/weight_update/v3", 3)
    assert path == tmp_path / "name_resolve" / "served_weights.json"
    assert discovery.read_served_weights(tmp_path) == ("/runs/x/weight_update/v3", 3)
    path.write_text('{"path": "/a"}')
    with pytest.raises(ValueError, match="served_weights.json is unreadable .*delete it"):
        discovery.read_served_weights(tmp_path)
    discovery.clear_served_weights(tmp_path)
    assert discovery.read_served_weights(tmp_path) is None
