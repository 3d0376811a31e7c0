"""Pushing new weights into a running vLLM engine, in place (vllm 0.32):

    "file"      the tensors go to one safetensors file in a fresh folder under
                VLLMConfig.weight_dir (a tmpfs: /dev/shm), and every worker reloads
                from it: collective_rpc("reload_weights", weights_path=folder). Tensors
                cannot cross vLLM's collective_rpc to its worker processes ("cannot
                pickle memoryview objects"); a file can. Measured on CPU (0.06 s for a
                tiny model); the same call exists on GPU, unverified there.
    "cuda_ipc"  CUDA IPC handles of the tensors (one copy on each of the engine's GPUs,
                keyed by the GPU's UUID) through vLLM's weight-transfer engine, backend
                "ipc": start_weight_update, update_weights, finish_weight_update.
                Written against vllm 0.32's IPCWeightTransferUpdateInfo; not run on
                hardware here.

Either way the names are HF names (vLLM's load_weights maps them to its fused layers).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Iterable

import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def model_dtype(engine: Any) -> torch.dtype:
    """The dtype vLLM resolved for the served model ("auto" -> the folder's)."""
    dtype = engine.vllm_config.model_config.dtype
    return dtype if isinstance(dtype, torch.dtype) else _DTYPES[str(dtype)]


def write_file(named: NamedTensors, folder_root: str, dtype: torch.dtype) -> str:
    """A fresh folder under `folder_root` holding model.safetensors; the caller removes it."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in named:
        t = tensor.detach().to("cpu", dtype).contiguous()
        if t.data_ptr() in seen:  # safetensors refuses shared storage (a tied head)
            t = t.clone()
        seen.add(t.data_ptr())
        tensors[name] = t
    if not tensors:
        raise ValueError("update_weights got no tensors")
    folder = tempfile.mkdtemp(prefix="dynarl-vllm-weights-", dir=folder_root)
    try:
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


async def push_file(engine: Any, named: NamedTensors, folder_root: str) -> None:
    folder = write_file(named, folder_root, model_dtype(engine))
    try:
        await engine.collective_rpc("reload_weights", kwargs={"weights_path": folder})
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def init_cuda_ipc(engine: Any) -> None:
    """Once per engine, before the first "cuda_ipc" push (unverified on hardware)."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    await engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info={"packed": False}))


async def push_cuda_ipc(engine: Any, named: NamedTensors, gpu_ids: list[int]) -> None:
    """One IPC handle per tensor and GPU of the engine (each TP worker rebuilds the copy
    on its own GPU, found by UUID); the copies live until vLLM has loaded them.
    Unverified on hardware."""
    from torch.multiprocessing.reductions import reduce_tensor
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    dtype = model_dtype(engine)
    uuids = {gpu: str(torch.cuda.get_device_properties(gpu).uuid) for gpu in gpu_ids}
    names, dtype_names, shapes, handles, keep = [], [], [], [], []
    for name, tensor in named:
        per_gpu = {}
        for gpu, uuid in uuids.items():
            copy = tensor.detach().to(f"cuda:{gpu}", dtype).contiguous()
            keep.append(copy)
            per_gpu[uuid] = reduce_tensor(copy)[1]
        names.append(name)
        dtype_names.append(str(dtype).split(".")[-1])
        shapes.append(list(tensor.shape))
        handles.append(per_gpu)
    for gpu in gpu_ids:
        torch.cuda.synchronize(gpu)
    await engine.start_weight_update()
    await engine.update_weights(WeightTransferUpdateRequest(update_info={
        "names": names, "dtype_names": dtype_names, "shapes": shapes, "ipc_handles": handles}))
    await engine.finish_weight_update()
    del keep
