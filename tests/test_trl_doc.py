NUM_GPUS = 0
"""docs/trl.md ("Coming from TRL") stays true: every dynarl key it names exists, with
the default it gives."""

import dataclasses
import pathlib
import re

import pytest

from dynarl.components.workflows.config import TrainConfig
from dynarl.core import yaml_config

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "trl.md"


def rows() -> list[tuple[list[str], list[str]]]:
    """(keys, defaults) of each table row naming dynarl keys."""
    out = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("TRL `GRPOConfig`", "---"):
            continue
        keys = [k for k in re.findall(r"`([^`]+)`", cells[1]) if "." in k]
        if keys:
            out.append((keys, re.findall(r"`([^`]+)`", cells[2])))
    return out


def default_of(key: str):
    """The field's default, as a config that does not set it gets it (before the whole
    tree resolves a default that depends on other keys, such as trainer.warmup.steps)."""
    first, *rest = key.split(".")
    f = {f.name: f for f in dataclasses.fields(TrainConfig)}[first]
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    for name in rest:
        assert dataclasses.is_dataclass(value) and name in {f.name for f in dataclasses.fields(value)}, key
        value = getattr(value, name)
    return value


def test_the_table_names_keys():
    assert len(rows()) >= 20


@pytest.mark.parametrize("keys,defaults", rows(), ids=lambda v: ",".join(v) if isinstance(v, list) else v)
def test_each_key_exists_with_its_default(keys, defaults):
    values = [default_of(k) for k in keys]
    if defaults:
        assert len(defaults) == len(keys)
        assert values == [yaml_config.load(d) for d in defaults]
