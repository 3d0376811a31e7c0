"""YAML as dynarl reads configs and key=value overrides: PyYAML's safe loader, with
numbers in exponent form without a dot (3e-4, 1e5, 2E-3) read as numbers.

PyYAML implements YAML 1.1, whose float needs a dot ("3.0e-4"): it reads `lr: 3e-4`
as the string "3e-4". YAML 1.2, JSON and Python read it as a number, and so does this
loader (config_tree's type coercion also takes such strings, for data loaded elsewhere).
"""
from __future__ import annotations

import re
from typing import Any

import yaml  # type: ignore[import-untyped]

EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)?(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
"""A number with an exponent and no dot, or one YAML 1.1 also misses (".5e1")."""


class ConfigLoader(yaml.SafeLoader):
    """yaml.SafeLoader, and EXPONENT_FLOAT read as a float."""


ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789."))


def load(stream: Any) -> Any:
    """yaml.safe_load, with 3e-4 a number."""
    return yaml.load(stream, Loader=ConfigLoader)  # noqa: S506  (a SafeLoader subclass)
