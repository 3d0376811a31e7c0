NUM_GPUS = 0

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub: every model here is built locally

import pytest
import torch
import transformers

from dynarl.components.model.config import TINY_CONFIGS, ModelConfig
from dynarl.components.model.config import read_config
from dynarl.components.model.io import load_pretrained, load_weights, save_pretrained
from dynarl.components.model.paged_attention import KVCache, PagedContext
from dynarl.components.model.qwen2 import Qwen2ForCausalLM

torch.set_num_threads(2)

SMALL = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, rope_theta=5000.0, rms_norm_eps=1e-5)
QWEN3 = dataclasses.replace(SMALL, model_type="qwen3", attention_bias=False, qk_norm=True, explicit_head_dim=24)
"""Qwen3's shape: no q/k/v bias, q/k norms, and a head_dim apart from hidden_size / heads (4 x 24 != 64)."""
LLAMA = dataclasses.replace(SMALL, model_type="llama", attention_bias=False, rope_llama3=(8.0, 1.0, 4.0, 64))
"""Llama 3's shape: no bias, RoPE scaled (a short original context, so every band of the scaling is used)."""
CONFIGS = [
    pytest.param(SMALL, id="gqa"),
    pytest.param(dataclasses.replace(SMALL, num_key_value_heads=4), id="mha"),
    pytest.param(dataclasses.replace(SMALL, tie_word_embeddings=True, num_key_value_heads=1), id="tied-mqa"),
    pytest.param(TINY_CONFIGS["tiny-0.5m"], id="tiny-0.5m"),
    pytest.param(QWEN3, id="qwen3"),
    pytest.param(dataclasses.replace(QWEN3, tie_word_embeddings=True), id="qwen3-tied"),
    pytest.param(LLAMA, id="llama3"),
    pytest.param(dataclasses.replace(LLAMA, rope_llama3=None, num_key_value_heads=4), id="llama-mha"),
]


def hf_model(config: ModelConfig, attn: str = "sdpa"):
    """transformers' own model of config's model_type (Qwen2, Qwen3 or Llama)."""
    fields = {k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "model_type")}
    hf_config = transformers.AutoConfig.for_model(config.model_type, **fields)
    hf_config._attn_implementation = attn
    return transformers.AutoModelForCausalLM.from_config(hf_config).eval()


def ours(config: ModelConfig, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config, init_std=0.1).eval()  # larger than default so logits are not ~0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)  # non-trivial biases and norm scales
    return model


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_logits_match_transformers(config, attn):
    model = ours(config)
    reference = hf_model(config, attn)
    assert set(reference.state_dict()) == set(model.state_dict())
    reference.load_state_dict(model.state_dict())
    input_ids = torch.randint(0, config.vocab_size, (3, 21))
    with torch.no_grad():
        ours_logits, hf_logits = model(input_ids), reference(input_ids).logits
    assert ours_logits.abs().max() > 0.1
    torch.testing.assert_close(ours_logits, hf_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("padding", ["right", "left"])
def test_padded_batch_matches_transformers(padding):
    model = ours(SMALL)
    reference = hf_model(SMALL)
    reference.load_state_dict(model.state_dict())
    input_ids = torch.randint(0, SMALL.vocab_size, (3, 15))
    mask = torch.ones_like(input_ids)
    if padding == "right":
        mask[0, 9:] = 0
        mask[2, 4:] = 0
    else:
        mask[0, :6] = 0
        mask[2, :11] = 0
    # HF's forward numbers positions 0..T-1 whatever the mask; generate() counts real tokens
    # only, which is what ours does with a mask. Give HF those positions explicitly.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours_logits = model(input_ids, attention_mask=mask)
        hf_logits = reference(input_ids, attention_mask=mask, position_ids=positions).logits
    assert not ours_logits.isnan().any()
    real = mask.bool()
    torch.testing.assert_close(ours_logits[real], hf_logits[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("config", [SMALL, QWEN3, LLAMA], ids=["qwen2", "qwen3", "llama3"])
def test_paged_prefill_and_decode_match_full_forward(block_size, config):
    """The rollout path: prefill a batch of different lengths into a block cache with
    scattered block tables, then decode 3 tokens each, batched; each step's logits must
    equal a full forward over the whole sequence."""
    SMALL = config  # (the shape under test)
    model = ours(SMALL)
    lengths = [9, 2, 17]
    seqs = [torch.randint(0, SMALL.vocab_size, (n + 3,)).tolist() for n in lengths]
    free = torch.randperm(64).tolist()
    tables = [[free.pop() for _ in range(-(-(n + 3) // block_size))] for n in lengths]
    cache = KVCache.allocate(SMALL.num_hidden_layers, 64, block_size, SMALL.num_key_value_heads, SMALL.head_dim)
    with torch.no_grad():
        ctx = PagedContext.build(lengths, lengths, tables, block_size)
        packed = torch.tensor([t for s, n in zip(seqs, lengths) for t in s[:n]])
        logits = model.forward_paged(packed, cache, ctx)
        for step in range(4):
            for b, (s, n) in enumerate(zip(seqs, lengths)):
                full = model(torch.tensor([s[:n + step]]))[0, -1]
                torch.testing.assert_close(logits[b], full, atol=1e-5, rtol=0)
            if step == 3:
                break
            ctx = PagedContext.build([1] * 3, [n + step + 1 for n in lengths], tables, block_size)
            logits = model.forward_paged(torch.tensor([s[n + step] for s, n in zip(seqs, lengths)]), cache, ctx)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("max_shard_bytes", [None, 40_000])
def test_save_load_round_trip_through_hf(tmp_path, config, max_shard_bytes):
    model = ours(config)
    save_pretrained(model, tmp_path / "ours", max_shard_bytes=max_shard_bytes)
    index = tmp_path / "ours" / "model.safetensors.index.json"
    assert index.is_file() == (max_shard_bytes is not None)
    if index.is_file():
        assert len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    assert read_config(tmp_path / "ours") == config
    loaded = load_pretrained(tmp_path / "ours")
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert type(reference).__name__ == config.to_hf_dict()["architectures"][0]
    input_ids = torch.randint(0, config.vocab_size, (2, 11))
    with torch.no_grad():
        expected = model(input_ids)
        torch.testing.assert_close(loaded(input_ids), expected, atol=0, rtol=0)
        torch.testing.assert_close(reference(input_ids).logits, expected, atol=1e-5, rtol=0)
    # and back: a folder written by transformers (sharded by its own rule) loads here
    reference.save_pretrained(tmp_path / "hf", max_shard_size="50KB")
    again = load_pretrained(tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids), expected, atol=1e-5, rtol=0)
    if config.tie_word_embeddings:
        assert again.lm_head.weight is again.model.embed_tokens.weight


def test_load_weights_names_the_bad_tensor():
    model = ours(SMALL)
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_weights(model, [("model.norm.weight", torch.ones(3))])
    with pytest.raises(ValueError, match="model.nope"):
        load_weights(model, [("model.nope", torch.ones(3))])
    with pytest.raises(ValueError, match="missing tensors"):
        load_weights(model, [("model.norm.weight", torch.ones(64))], strict=True)


@pytest.mark.parametrize("change, field", [
    pytest.param({"hidden_size": 0}, "hidden_size", id="zero-hidden"),
    pytest.param({"hidden_size": 66}, "num_attention_heads", id="hidden-not-divisible"),
    pytest.param({"num_key_value_heads": 3}, "num_key_value_heads", id="kv-not-divisor"),
    pytest.param({"rope_theta": 0.0}, "rope_theta", id="rope-theta"),
    pytest.param({"rms_norm_eps": -1.0}, "rms_norm_eps", id="eps"),
    pytest.param({"eos_token_id": 96}, "eos_token_id", id="eos-out-of-vocab"),
    pytest.param({"num_hidden_layers": 2.0}, "num_hidden_layers", id="float-layers"),
])
def test_config_rejects_bad_values(change, field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(SMALL, **change)


@pytest.mark.parametrize("change, field", [
    pytest.param({"hidden_act": "gelu"}, "hidden_act", id="act"),
    pytest.param({"use_sliding_window": True}, "use_sliding_window", id="sliding"),
    pytest.param({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "rope_type", id="yarn"),
    pytest.param({"head_dim": 8}, "head_dim", id="head-dim"),
    pytest.param({"model_type": "gpt2"}, "model_type 'gpt2' is not supported; supported: qwen2, qwen3, llama",
                 id="gpt2"),
    pytest.param({"model_type": "mistral"}, "model_type 'mistral'", id="mistral"),
    pytest.param({"model_type": "llama", "mlp_bias": True}, "mlp_bias", id="llama-mlp-bias"),
    pytest.param({"model_type": None}, "model_type None", id="no-model-type"),
])
def test_config_rejects_unsupported_hf_variants(change, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_hf_dict({**SMALL.to_hf_dict(), **change})


def test_tiny_configs_are_small():
    for name, config in TINY_CONFIGS.items():
        assert 0.3e6 < config.num_parameters < 10e6, name
        assert config.num_parameters == sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
