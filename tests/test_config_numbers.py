NUM_GPUS = 0
"""Numbers as users write them (issue 49): 3e-4 in an override or a YAML file is a
number, though PyYAML (YAML 1.1) reads it as a string; a whole number in exponent
form fits an integer field; what is not a number is still refused, naming the field."""

import subprocess
import sys

import pytest

from dynarl import ConfigError
from dynarl.components.workflows.config import load_config
from dynarl.core import yaml_config
from dynarl.launch.train import parse_override
from dynarl.launch.train_prepare import _read_yaml


@pytest.mark.parametrize("text,value", [
    ("3e-4", 0.0003), ("1e5", 100000.0), ("3E4", 30000.0), ("-2e-3", -0.002), ("+1e-1", 0.1), (".5e1", 5.0),
    ("1.0e-3", 0.001), ("0.0003", 0.0003), ("3", 3), ("[1e-3, 2e-3]", [0.001, 0.002]),
    ("'3e-4'", "3e-4"), ("1e", "1e"), ("e3", "e3"), ("7b", "7b"), ("2e3b", "2e3b"), ("abc", "abc"),
])
def test_yaml_reads_exponent_numbers_as_numbers(text, value):
    assert yaml_config.load(text) == value and type(yaml_config.load(text)) is type(value)


@pytest.mark.parametrize("override,path,value", [
    ("trainer.engine.lr=3e-4", "trainer.engine.lr", 0.0003),
    ("trainer.warmup.lr=1E-3", "trainer.warmup.lr", 0.001),
    ("trainer.engine.grad_clip=5e0", "trainer.engine.grad_clip", 5.0),
    ("runtime.cluster.device_memory_gb=8e1", "runtime.cluster.device_memory_gb", 80.0),  # float | None
    ("run.steps=1e2", "run.steps", 100),
    ("run.steps=2.0", "run.steps", 2),
    ("trainer.engine.max_tokens_per_micro_batch=4e3", "trainer.engine.max_tokens_per_micro_batch", 4000),
])
def test_an_override_takes_numbers_as_written(override, path, value):
    cfg = load_config(None, [parse_override(override)])
    got = cfg
    for key in path.split("."):
        got = getattr(got, key)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("override,path,fragment", [
    ("run.steps=2.5", "run.steps", "expected an integer, got 2.5"),
    ("run.steps=1e-1", "run.steps", "expected an integer, got 0.1"),
    ("trainer.engine.lr=3e-4x", "trainer.engine.lr", "expected a number, got '3e-4x'"),
    ("trainer.engine.lr=fast", "trainer.engine.lr", "expected a number, got 'fast'"),
])
def test_what_is_not_such_a_number_is_refused_naming_the_field(override, path, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, [parse_override(override)])
    assert info.value.path == path and fragment in str(info.value)


def test_a_yaml_file_takes_exponent_numbers(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("trainer:\n  engine:\n    lr: 3e-4\n  warmup:\n    lr: 1e-3\nrun:\n  steps: 1e1\n")
    cfg = load_config(_read_yaml(str(config)))
    assert (cfg.trainer.engine.lr, cfg.trainer.warmup.lr, cfg.run.steps) == (0.0003, 0.001, 10)


def test_the_command_line_of_issue_49_is_accepted():
    done = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "trainer.engine.lr=3e-4", "--dry-run"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
