"""Helpers of the real-SGLang tests (tests/test_sglang_real_*.py, run by .ci/engine_sglang
in the SGLang venv): the CPU environment, a tiny random Qwen2 folder, the engine's
settings, greedy references from transformers.

ready_cpu_env() readies the environment for SGLang on a CPU (start() calls it)."""
import importlib.util
import os
import sys

import torch
import transformers

from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.sglang.config import SGLangConfig

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_cpu_site")


def ready_cpu_env() -> None:
    """SGLang on a CPU: SGLANG_USE_CPU_ENGINE, and the test-only stand-ins of
    tests/sglang_cpu_site for this process and (through PYTHONPATH) the processes SGLang
    spawns, unless .ci/engine_sglang set them already. Called by the tests' fixtures,
    not at import: the main run collects these files too (and deselects them)."""
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # else SGLang imports vllm for RoPE
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if os.environ.get("DYNARL_TEST_SGLANG_CPU") == "1" and SITE in sys.path:
        return
    os.environ["DYNARL_TEST_SGLANG_CPU"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, SITE)
    spec = importlib.util.spec_from_file_location("sglang_cpu_site", os.path.join(SITE, "sitecustomize.py"))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # the import hook, in this process


SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0,
             tie_word_embeddings=False)
CPU_ARGS = dict(device="cpu", attention_backend="torch_native", disable_overlap_schedule=True, max_total_tokens=4096,
                skip_server_warmup=True, dtype="float32")


def random_model(seed: int) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(**SHAPE, dtype="float32")
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def hf_folder(path, seed: int = 0) -> str:
    """transformers' random Qwen2 (seed), saved by transformers, with dynarl's character
    tokenizer (its vocabulary fits in 128; SGLang itself reads no tokenizer:
    skip_tokenizer_init)."""
    random_model(seed).save_pretrained(path)
    CharTokenizer().save(path)
    return str(path)


def engine_config(model_path: str, **fields) -> SGLangConfig:
    """SGLang on this CPU: no memory saver (torch_memory_saver is CUDA-only), a small KV."""
    return SGLangConfig(model_path=model_path, enable_memory_saver=False, mem_fraction_static=0.3, random_seed=0,
                        server_args=dict(CPU_ARGS), **fields)


def req(rid: str, prompt, max_new: int = 16, **sampling) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    return GenerationRequest(rid, list(prompt), SamplingParams(max_new_tokens=max_new, **sampling))


def greedy(model: transformers.PreTrainedModel, prompt, max_new: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of `prompt` and each chosen token's logprob."""
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    tokens = out.sequences[0, ids.shape[1]:].tolist()
    logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, tokens)]
    return tokens, logprobs


async def until_generating(engine, timeout_s: float = 60.0) -> None:
    """Until SGLang's scheduler runs at least one of the engine's requests."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await engine.load()).num_running == 0:
        assert asyncio.get_running_loop().time() < deadline, "no request started generating"
        await asyncio.sleep(0.05)


async def until_kv_tokens(engine, tokens: int, timeout_s: float = 120.0) -> None:
    """Until the engine's running requests hold at least `tokens` tokens of KV (prompt
    and output: how far they got, whatever the machine's speed)."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await engine.load()).active_kv_tokens < tokens:
        assert asyncio.get_running_loop().time() < deadline, f"the requests did not reach {tokens} tokens"
        await asyncio.sleep(0.05)


def start(config):
    """An SGLangRolloutEngine on a real engine, and the processes SGLang started for it.
    Call inside the running loop the engine will serve."""
    import psutil

    from dynarl.components.rollout.sglang.engine import SGLangRolloutEngine

    ready_cpu_env()
    before = set(psutil.Process().children(recursive=True))
    engine = SGLangRolloutEngine.start(config)
    return engine, [p for p in psutil.Process().children(recursive=True) if p not in before]


def shutdown(engine, processes) -> None:
    """Stop the engine and check that its processes are gone (reaped, or zombies of a
    parent that is not this process)."""
    import psutil

    engine.shutdown()
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert not alive, f"SGLang processes left behind: {alive}"


def tree_rss_gb() -> float:
    """Resident memory of this process and all its descendants, in GB."""
    import psutil

    procs = [psutil.Process()] + psutil.Process().children(recursive=True)
    return sum(p.memory_info().rss for p in procs if p.is_running()) / 1e9
