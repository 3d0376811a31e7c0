NUM_GPUS = 0

import pytest

from dynarl import ConfigError, RuntimeConfig
from dynarl.core.config_tree import apply_override, build, to_dict


def test_build_and_round_trip():
    cfg = build(RuntimeConfig, {"launcher": "inproc", "cluster": {"devices_per_node": 8}})
    assert cfg.cluster.num_devices == 8 and cfg.launcher == "inproc"
    assert build(RuntimeConfig, to_dict(cfg)) == cfg


@pytest.mark.parametrize("data,path,fragment", [
    pytest.param({"launcher": "ray"}, "launcher", "choose from 'local', 'inproc', 'agent'", id="literal"),
    pytest.param({"cluster": {"devices_per_nod": 2}}, "cluster.devices_per_nod", "allowed keys", id="typo"),
    pytest.param({"cluster": {"num_nodes": "two"}}, "cluster.num_nodes", "expected an integer", id="type"),
    pytest.param({"cluster": {"num_nodes": 0}}, "cluster.num_nodes", "cluster.num_nodes: must be >= 1", id="range"),
    pytest.param({"heartbeat_timeout_s": True}, "heartbeat_timeout_s", "expected a number", id="bool-not-number"),
    pytest.param({"trace_path": 3}, "trace_path", "fits none", id="optional"),
])
def test_errors_name_the_field_path(data, path, fragment):
    with pytest.raises(ConfigError) as info:
        build(RuntimeConfig, data)
    assert info.value.path == path
    assert fragment in str(info.value)


def test_dotted_override():
    data: dict = {}
    apply_override(data, "cluster.devices_per_node", 4)
    assert build(RuntimeConfig, data).cluster.devices_per_node == 4
