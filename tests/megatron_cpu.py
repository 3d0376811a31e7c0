"""Test-only shims that let megatron-core 0.16.1 run on CPU over gloo, and a helper
that runs a function on N spawned gloo ranks.

megatron-core assumes CUDA in a few hard-coded places (BACKENDS.md B3,
MEASURED.md). The product code stays GPU-idiomatic; these patches are applied
only inside the spawned test processes, never in the pytest process itself, so no
other test sees a patched torch.cuda.
"""
from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch


def apply_cpu_shims() -> None:
    """Redirect the CUDA-only calls megatron-core makes to their CPU equivalents."""
    import megatron.core.tensor_parallel.random as mp_random

    torch.cuda.current_device = lambda: "cpu"  # buffers, rotary inv_freq, GlobalMemoryBuffer
    torch.cuda.synchronize = lambda *args, **kwargs: None  # dist_checkpointing
    torch.cuda.empty_cache = lambda: None
    # model_parallel_cuda_manual_seed and the attention's RNG fork read and write CUDA
    # generator state; on CPU the default generator stands in for it.
    torch.cuda.manual_seed = lambda seed: None
    torch.cuda.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    mp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # language_module's tied-embedding path
    # megatron's own optimizers: they check `param.type()` for "torch.cuda.*Tensor" and
    # make their scalars (found_inf, the norm's overflow buffer) with device="cuda"
    real_type = torch.Tensor.type

    def cuda_type(self, *args, **kwargs):
        name = real_type(self, *args, **kwargs)
        return name.replace("torch.", "torch.cuda.", 1) if not (args or kwargs or ".cuda." in name) else name
    torch.Tensor.type = cuda_type
    for factory in ("tensor", "zeros", "empty", "ones", "full"):
        setattr(torch, factory, _on_cpu(getattr(torch, factory)))


def _on_cpu(factory: Callable[..., Any]) -> Callable[..., Any]:
    def made(*args: Any, device: Any = None, **kwargs: Any) -> Any:
        if isinstance(device, str) and device.startswith("cuda"):
            device = "cpu"
        return factory(*args, device=device, **kwargs)
    return made


def _rank_main(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, error_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        apply_cpu_shims()
        store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
        torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                             timeout=timedelta(seconds=300))
        fn(rank, world, *args)
    except BaseException:
        with open(os.path.join(error_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def spawn_ranks(fn: Callable[..., Any], world: int, *args: Any, error_dir: str, timeout_s: float = 600.0
                ) -> dict[str, Any]:
    """Run fn(rank, world, *args) on `world` spawned processes with a gloo default group.
    Returns exit codes, pids (all joined), errors (tracebacks by rank) and the wall time."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    # The store's server lives here, on a port the OS picks while binding it: no window
    # in which another process on this busy machine could take a port we chose.
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=300))
    port = store.port
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, fn, args, error_dir)) for r in range(world)]
    started = time.monotonic()
    try:
        for p in procs:
            p.start()
        deadline = started + timeout_s
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    errors = {}
    for r in range(world):
        path = os.path.join(error_dir, f"rank{r}.err")
        if os.path.exists(path):
            with open(path) as f:
                errors[r] = f.read()
    return {"exitcodes": [p.exitcode for p in procs], "pids": [p.pid for p in procs],
            "errors": errors, "seconds": time.monotonic() - started}


class RecordingOptimizer:
    """Stands in for megatron's optimizer where a test needs the reduced gradients. It keeps the
    reduced gradients a step would consume and leaves the weights alone, so a test can
    compare them with the native trainer's. Matches MegatronTrainer's OptimizerFactory."""

    def __init__(self, ddp_model, config=None, megatron=None) -> None:
        self.module = ddp_model.module
        self.grads: dict[str, torch.Tensor] = {}
        self.param_groups = [{"lr": 0.0}]  # megatron's interface: the trainer sets the step's lr here

    def zero_grad(self) -> None:
        pass  # DistributedDataParallel.zero_grad_buffer() zeroes main_grad

    def step(self):
        self.grads = {n: p.main_grad.detach().clone() for n, p in self.module.named_parameters()}
        return True, None, None

    def offload_to_cpu(self) -> None:
        pass

    def restore_from_cpu(self) -> None:
        pass
