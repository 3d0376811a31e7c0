"""Device memory a process lets go of.

torch's CUDA caching allocator keeps freed blocks for its own later use; another
process on the same GPU (the next component of a time-shared device, a new rank of
a reshard) cannot allocate them until they are given back. Ranks that park, retire
or offload call this after dropping their tensors.
"""
from __future__ import annotations

import gc

import torch


def release_cached_memory() -> None:
    """Frees what nothing references any more and gives torch's cached CUDA blocks back
    to the device. A no-op off CUDA (CPU memory goes back to the allocator at once)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
