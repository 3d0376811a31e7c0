"""How a remote call names its method: by reference, never by a string.

    await group.call(RolloutWorker.generate, "prompts", "rollouts")
    await handle.call(MigratableRank.workload_export)     # core/ calls a role Protocol's

`AsyncMethod[P, R]` and `SyncMethod[P, R]` are a worker's methods seen from the
controller (a call overloads on the two): mypy checks the arguments against the
method's signature (ParamSpec) and types the results as what it returns, awaited.
The wire carries the method's name; `method_name` checks that the group's class
defines it, so a wrong reference fails at the call, naming both.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Concatenate, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

AsyncMethod = Callable[Concatenate[Any, P], Awaitable[R]]
"""An async method of a worker class (its first parameter the worker)."""
SyncMethod = Callable[Concatenate[Any, P], R]
"""A plain method of a worker class."""


def method_name(method: Callable[..., Any], cls: type | None = None) -> str:
    """The name a call to `method` sends; with `cls`, checked against that worker class."""
    name = getattr(method, "__name__", None)
    qualname = getattr(method, "__qualname__", "")
    if not callable(method) or not isinstance(name, str) or "." not in qualname or "<" in qualname:
        raise TypeError(f"a remote call names a worker method by reference (Class.method), not {method!r}")
    if name.startswith("_"):
        raise TypeError(f"{method.__qualname__} is private and cannot be called remotely")
    if cls is not None and not callable(getattr(cls, name, None)):
        raise TypeError(f"{cls.__name__} has no method {name!r} (called as {method.__qualname__})")
    return name
