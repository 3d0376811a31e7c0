"""How a remote call names its method: by reference, never by a string.

    await group.call(RolloutWorker.generate, "prompts", "rollouts")
    await handle.call(MigratableRank.workload_export)     # core/ calls a role Protocol's

`Method[P, R]` is a worker method (sync or async) seen from the controller: mypy
checks the arguments against its signature (ParamSpec) and types the results as its
return. The wire carries the method's name; `method_name` checks that the group's
class defines it, so a wrong reference fails at the call, naming both.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Concatenate, ParamSpec, TypeVar, Union

P = ParamSpec("P")
R = TypeVar("R")

Method = Union[Callable[Concatenate[Any, P], Awaitable[R]], Callable[Concatenate[Any, P], R]]
"""A method of a worker class (its first parameter the worker), plain or async."""


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
