"""Where reward.function lives, and loading it.

    "package.module:fn"     a module on the import path
    "path/to/file.py:fn"    a Python file; its folder joins the import path, so it may
                            import the files beside it

In the reward worker's own process the function is imported (`load_function`). In
sandbox mode it never runs outside the sandbox: its file is found without importing it
(`source_file`), read, compiled and looked for at the top level (`check_source`), and
the sandbox runs that text (sandboxed.py). Every error is a ValueError whose text, after
the key's name, is one line (config.py reports it as `reward.function: ...`).
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

_SPEC = re.compile(r"^(?P<target>[^:]+\.py|[A-Za-z_][\w.]*):(?P<name>[A-Za-z_]\w*)$")

KEYWORDS = ("prompt", "problem_id", "sample_id", "metadata")
"""What a per-sample call may take beside (response, answer), each by its name."""
BATCH_KEYWORDS = ("prompts", "problem_ids", "sample_ids", "metadata")
"""A batched call's: lists, one item per sample (metadata: a list of mappings)."""


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    target: str
    """A dotted module name, or a path ending in .py."""
    name: str

    @property
    def is_file(self) -> bool:
        return self.target.endswith(".py")


def parse_spec(text: Any) -> FunctionSpec:
    """`module:fn` or `path.py:fn`; ValueError("function ...") otherwise."""
    match = _SPEC.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"function must be 'module:fn' or 'path/to/file.py:fn', got {text!r}")
    return FunctionSpec(match["target"], match["name"])


def load_function(spec: FunctionSpec, batched: bool = False) -> Callable[..., Any]:
    """The function, imported; ValueError naming what is wrong: the module does not
    import (or raised while importing), it has no such name, the name is not callable,
    or its signature cannot take the call."""
    module = _load_file(spec.target) if spec.is_file else _import(spec.target)
    fn = getattr(module, spec.name, None)
    where = f"{spec.target}:{spec.name}"
    if fn is None:
        raise ValueError(f"{spec.target!r} has no {spec.name!r}")
    if not callable(fn):
        raise ValueError(f"{where} is a {type(fn).__name__}, not a function")
    problem = signature_problem(fn, batched)
    if problem is not None:
        raise ValueError(f"{where} {problem}")
    return fn


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        hint = "; or give its file: path/to/file.py:fn" if exc.name == name.split(".")[0] else ""
        raise ValueError(f"cannot import {name!r}: {exc}{hint}") from None
    except Exception as exc:  # (SyntaxError is one) whatever the module raised while importing
        raise ValueError(f"importing {name!r} raised {type(exc).__name__}: {_one_line(exc)}") from None


def _load_file(path: str) -> Any:
    """The file as a module (once per process: loaded again, the same module)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"no file {path!r}")
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    name = f"dynarl_reward_{stem}_{hashlib.blake2b(path.encode(), digest_size=4).hexdigest()}"
    if name in sys.modules:
        return sys.modules[name]
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.append(folder)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # (dataclasses and pickle look a class's module up there)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ValueError(f"loading {path!r} raised {type(exc).__name__}: {_one_line(exc)}") from None
    return module


def keywords_for(fn: Callable[..., Any], names: tuple[str, ...]) -> tuple[str, ...]:
    """The context keywords to pass: those of `names` its signature takes (all of them
    with **kwargs; none when it has no signature to read)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return names
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(n for n in names if n in params and params[n].kind in by_name)


def signature_problem(fn: Callable[..., Any], batched: bool) -> str | None:
    """Why `fn` cannot be called as the reward stage calls it, or None."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # (a builtin without a signature: its call will tell)
    names = BATCH_KEYWORDS if batched else KEYWORDS
    keywords = keywords_for(fn, names)
    try:
        signature.bind(None, None, **dict.fromkeys(keywords))
    except TypeError as exc:
        first = "responses, answers" if batched else "response, answer"
        return (f"cannot be called as fn({first}, **context) with context keywords from {', '.join(names)} "
                f"({exc}; its signature: {signature})")
    return None


def source_file(spec: FunctionSpec) -> str:
    """The file that defines the module, found on the import path without importing
    anything (sandbox mode: nothing of it runs here)."""
    if spec.is_file:
        path = os.path.abspath(spec.target)
        if not os.path.isfile(path):
            raise ValueError(f"no file {path!r}")
        return path
    parts = spec.target.split(".")
    for entry in sys.path:
        base = os.path.join(entry or os.getcwd(), *parts)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return os.path.abspath(candidate)
    raise ValueError(f"cannot find module {spec.target!r} on the import path (sandbox mode reads its file); "
                     "or give its file: path/to/file.py:fn")


def check_source(path: str, name: str) -> str:
    """The file's text, once it is readable, compiles and defines `name` at its top
    level (a def, async def, class, assignment or import of that name)."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path!r}: {_one_line(exc)}") from None
    try:
        tree = ast.parse(source, path)
        compile(tree, path, "exec")
    except (SyntaxError, ValueError) as exc:
        line = f" line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        raise ValueError(f"{path}{line}: {type(exc).__name__}: {getattr(exc, 'msg', None) or exc}") from None
    if name not in _top_level_names(tree):
        raise ValueError(f"{path!r} defines no {name!r} at its top level")
    return source


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
