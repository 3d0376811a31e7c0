"""Test-only: with DYNARL_TEST_MEGATRON_CPU=1 and this folder on PYTHONPATH, every
Python process of a `dynarl train` run (controller and workers; the local launcher
passes PYTHONPATH on) applies tests/megatron_cpu.py's CPU shims the moment it
imports megatron-core, so trainer.backend=megatron runs end to end on a CPU.
Processes that never import megatron pay nothing. Product code has no shims.
"""
import importlib.abc
import importlib.util
import os
import sys

_TARGET = "megatron.core.tensor_parallel.random"
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _ShimOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)  # find the real module, once
        spec = importlib.util.find_spec(name)
        self._real = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        self._real.exec_module(module)
        sys.modules[_TARGET] = module
        if _TESTS not in sys.path:
            sys.path.append(_TESTS)
        from megatron_cpu import apply_cpu_shims

        apply_cpu_shims()


if os.environ.get("DYNARL_TEST_MEGATRON_CPU") == "1":
    sys.meta_path.insert(0, _ShimOnImport())
