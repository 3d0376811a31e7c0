"""docs/config.md from the config dataclasses: every key of `dynarl train` with its
type, default and meaning.

    python -m dynarl.launch.config_doc > docs/config.md

The meaning is the string literal written under each field in its class (read with
`ast`); the default is the value a config with no file takes (the parent's default
instance, so `rollout.engine.num_blocks` shows the rollout's 2048, not the engine
class's own); sections that default to null show their class's defaults.
tests/test_config_doc.py checks that the committed file is what this prints.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
import typing
from typing import Any

UNDOCUMENTED = "(no description in the source yet)"
HEADER = """# `dynarl train` configuration

Every key of a `dynarl train` config file (or `key.path=value` override), generated
from the config dataclasses by `python -m dynarl.launch.config_doc > docs/config.md`
(tests/test_config_doc.py keeps this file equal to its output). Keys are validated at
load; an error names the key's path and exits with code 2. A section whose default
is `null` (e.g. `rollout.sglang`) takes its class's defaults when given.
"""


def field_docs(cls: type) -> dict[str, tuple[str, str]]:
    """name -> (annotation as written, the string literal under the field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    out: dict[str, tuple[str, str]] = {}
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = ""
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                doc = inspect.cleandoc(nxt.value.value)
            out[node.target.id] = (ast.unparse(node.annotation), doc)
    return out


def own_doc(cls: type) -> str:
    """The class's own docstring; not the signature dataclasses write when it has none."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(cls.__name__ + "(") else inspect.cleandoc(doc)


def _section_class(tp: Any) -> type | None:
    """The dataclass of a field's type, also through `X | None`."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _show(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        value = list(value)
    return repr(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def sections(cls: type, instance: Any, path: str) -> list[tuple[str, type, list[tuple[str, str, str, str]]]]:
    """(section path, class, rows of (key, type, default, meaning)), depth first."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        annotation, doc = docs.get(f.name, (str(hints[f.name]), ""))
        value = getattr(instance, f.name) if instance is not None else _default(f)
        key = f"{path}.{f.name}" if path else f.name
        sub = _section_class(hints[f.name])
        if sub is not None:
            doc = doc or own_doc(sub).split("\n\n")[0] or f"the `{key}` section below"
            rows.append((key, annotation, "section" if value is not None else "null", doc))
            nested.append((key, sub, value))
        else:
            rows.append((key, annotation, _show(value), doc))
    out = [(path, cls, rows)]
    for key, sub, value in nested:
        out += sections(sub, value, key)
    return out


def render() -> str:
    from dynarl.components.workflows.config import TrainConfig
    lines = [HEADER]
    for path, cls, rows in sections(TrainConfig, TrainConfig(), ""):
        title = f"`{path}`" if path else "top level"
        lines.append(f"## {title}\n")
        doc = own_doc(cls)
        if doc and path:
            lines.append(_cell(doc) + "\n")
        lines.append("| key | type | default | meaning |\n|---|---|---|---|")
        lines += [f"| `{k}` | `{_cell(t)}` | `{_cell(d)}` | {_cell(m) or UNDOCUMENTED} |" for k, t, d, m in rows]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
