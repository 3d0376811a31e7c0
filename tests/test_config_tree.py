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


@pytest.mark.parametrize("text, value", [("2e-3", 0.002), ("1e-5", 1e-5), ("+1.5E+2", 150.0), (".5", 0.5),
                                         ("3", 3.0)])
def test_a_float_field_takes_numbers_yaml_reads_as_strings(text, value):
    from dynarl.components.trainer.base import TrainerConfig
    assert build(TrainerConfig, {"lr": text}).lr == value


@pytest.mark.parametrize("text", ["nan", "inf", "2e", "e-3", "1,5", "0x10"])
def test_a_float_field_refuses_what_is_not_a_decimal_number(text):
    from dynarl.components.trainer.base import TrainerConfig
    with pytest.raises(ConfigError, match="lr: expected a number"):
        build(TrainerConfig, {"lr": text})
