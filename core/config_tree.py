"""Builds validated config dataclasses from plain mappings (YAML, key=value overrides).

Every error names the field path (`cluster.devices_per_node`) and, where the
choice is closed, the allowed values. Unknown keys are errors, not ignored:
a typo silently falling back to a default costs a cluster run.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any, Literal, get_args, get_origin, get_type_hints

from dynarl.transport.errors import ConfigError

_DECIMAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
"""A number as written in a config: 3, 0.5, 2e-3, 1.0e+30 (not nan or inf)."""


def build(cls: type, data: Any, path: str = "") -> Any:
    """Constructs dataclass `cls` from mapping `data`, recursively."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = _join(path, unknown[0])
        raise ConfigError(where, f"unknown key; allowed keys here: {', '.join(names)}")
    kwargs = {name: _convert(hints[name], data[name], _join(path, name)) for name in names if name in data}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        # A check that names its field first ("steps must be >= 1") reports that field's
        # path (run.steps: must be >= 1), so the message points at the value to change.
        message = str(exc)
        field, _, rest = message.partition(" ")
        if field in names and rest:
            raise ConfigError(_join(path, field), rest) from None
        raise ConfigError(path or cls.__name__, message) from None


def to_dict(obj: Any) -> Any:
    """The inverse of `build`: plain data for YAML/JSON (the resolved config)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def apply_override(data: dict, dotted: str, value: Any) -> None:
    """Sets `a.b.c=value` inside nested mapping `data`; an optional section left unset
    (None, e.g. rollout.sglang) starts empty."""
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        if node.get(key) is None:
            node[key] = {}
        nxt = node[key]
        if not isinstance(nxt, dict):
            raise ConfigError(dotted, f"{key} is not a section")
        node = nxt
    node[keys[-1]] = value


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(path, f"{value!r} is not allowed; choose from {', '.join(map(repr, allowed))}")
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(path, f"{value!r} fits none of the allowed types ({'; '.join(errors)})")
    if origin in (list, tuple):
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {type(value).__name__}")
        inner = args[0] if args else Any
        items = [_convert(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        whole = _whole_number(value)  # 1e5, 1e5 read as text, 2.0
        if whole is not None:
            return whole
        raise ConfigError(path, f"expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):  # YAML 1.1 reads 2e-3 as a string
            return float(value)
        raise ConfigError(path, f"expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(path, f"expected a string, got {value!r}")
    return value


def _whole_number(value: Any) -> int | None:
    """A float or decimal text whose value is a whole number (exactly: under 2**53), as int."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def wire_config(code: int):
    """Class decorator: a config dataclass crosses the wire (RPC arguments, a worker's
    constructor) as itself: its plain data (`to_dict`), rebuilt and validated on the
    other side (`build`: an invalid record is rejected as malformed)."""
    from dynarl.transport.wire import register_struct

    def register(cls: type) -> type:
        return register_struct(code, encode=lambda obj: [to_dict(obj)],
                               decode=lambda fields: build(cls, fields[0] if len(fields) == 1 else None))(cls)
    return register
