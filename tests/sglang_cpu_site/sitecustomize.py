"""Test-only: stand-ins for hardware this CPU machine lacks, for the real SGLang engine
in the SGLang venv (.ci/engine_sglang; tests/test_sglang_real_*.py). With
DYNARL_TEST_SGLANG_CPU=1 and this folder on PYTHONPATH, every process that imports
sglang (the test process and the scheduler and detokenizer processes SGLang spawns;
they inherit both variables) gets:

- `sgl_kernel` (the folder beside this file): SGLang's CPU kernels are a source build
  PyPI does not have; sglang imports a few names from it at import time on CPU. Each
  stand-in raises when called, so a test that reaches one fails loudly.
- `torch.cuda.synchronize` and `torch.cuda.empty_cache` as no-ops, and only when no
  CUDA device exists: SGLang's release/resume_memory_occupation call them through
  torch.get_device_module() whatever the device.

Nothing of SGLang's own logic is replaced. Processes that never import sglang pay nothing.
"""
import importlib.abc
import importlib.util
import os
import sys

_TARGET = "sglang"


def _no_op(*args, **kwargs):
    return None


def apply_cuda_shim() -> None:
    import torch

    if torch.cuda.is_available():
        return  # real hardware: nothing stands in
    torch.cuda.synchronize = _no_op
    torch.cuda.empty_cache = _no_op


class _ShimOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)  # find the real package, once
        spec = importlib.util.find_spec(name)
        self._real = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        apply_cuda_shim()
        self._real.exec_module(module)


if os.environ.get("DYNARL_TEST_SGLANG_CPU") == "1":
    sys.meta_path.insert(0, _ShimOnImport())
