NUM_GPUS = 0
"""HF <-> megatron name maps, qkv and gate/up layouts, TP slicing: pure torch, no
megatron needed (the spawned-rank tests in test_megatron_trainer.py check the same
rules against a real megatron model)."""
import pytest
import torch

from dynarl.components.model.config import ModelConfig
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.trainer.megatron.convert import (
    fuse_qkv, global_layer_name, hf_to_megatron, join_tp_shards, megatron_to_hf, slice_for_tp, split_qkv, tp_partition)
from dynarl.components.trainer.megatron.model_checks import check_tp_divisible

# 4 query heads in 2 groups, head_dim 2: small enough to write the fused layout out by hand
CFG = ModelConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)


def hf_state(config=CFG, seed=0):
    torch.manual_seed(seed)
    return {n: p.detach().clone() for n, p in Qwen2ForCausalLM(config).named_parameters()}


def test_fused_qkv_is_grouped_q_then_k_then_v():
    rows = lambda n, base: torch.arange(base, base + n, dtype=torch.float32)  # noqa: E731
    q, k, v = rows(8, 100), rows(4, 200), rows(4, 300)  # biases: 4 q heads x 2, 2 kv heads x 2
    fused = fuse_qkv(q, k, v, CFG)
    # group 0: q heads 0,1 | k head 0 | v head 0; then group 1
    assert fused.tolist() == [100, 101, 102, 103, 200, 201, 300, 301,
                              104, 105, 106, 107, 202, 203, 302, 303]
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fused, CFG), (q, k, v)))


def test_hf_megatron_hf_round_trip_is_exact():
    hf = hf_state()
    megatron = dict(hf_to_megatron(hf, CFG))
    assert megatron["decoder.layers.1.mlp.linear_fc1.weight"].shape == (24, 8)  # [gate ; up]
    back = {}
    for name, t in megatron.items():
        back.update(megatron_to_hf(name, t, CFG))
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[n], hf[n]) for n in hf)


def test_tied_model_has_no_output_layer_and_missing_tensors_are_named():
    tied = ModelConfig(**{**{f: getattr(CFG, f) for f in ("vocab_size", "hidden_size", "intermediate_size",
                                                         "num_hidden_layers", "num_attention_heads",
                                                         "num_key_value_heads")}, "tie_word_embeddings": True})
    hf = hf_state(tied)
    assert "output_layer.weight" not in dict(hf_to_megatron(hf, tied))
    del hf["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        dict(hf_to_megatron(hf, tied))


@pytest.mark.parametrize("name, dim, glu", [
    pytest.param("decoder.layers.0.self_attention.linear_qkv.weight", 0, False, id="qkv"),
    pytest.param("decoder.layers.0.self_attention.linear_qkv.bias", 0, False, id="qkv-bias"),
    pytest.param("decoder.layers.0.mlp.linear_fc1.weight", 0, True, id="fc1-glu"),
    pytest.param("decoder.layers.0.self_attention.linear_proj.weight", 1, False, id="row-parallel"),
    pytest.param("decoder.layers.0.mlp.linear_fc2.weight", 1, False, id="fc2"),
    pytest.param("embedding.word_embeddings.weight", 0, False, id="vocab"),
    pytest.param("decoder.layers.0.input_layernorm.weight", None, False, id="norm-replicated"),
])
def test_tp_partition_rules(name, dim, glu):
    assert tp_partition(name) == (dim, glu)


def test_glu_slices_hold_their_gate_and_up_parts():
    full = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)  # gate rows 0-3, up rows 4-7
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    parts = [slice_for_tp(name, full, r, 2) for r in range(2)]
    assert parts[1][:, 0].tolist() == [6, 9, 18, 21]  # gate rows 2,3 then up rows 6,7
    assert torch.equal(join_tp_shards(name, parts), full)


@pytest.mark.parametrize("name", ["decoder.layers.0.self_attention.linear_proj.weight",
                                  "decoder.layers.0.self_attention.linear_qkv.weight",
                                  "decoder.final_layernorm.weight"])
def test_slice_join_round_trip(name):
    full = torch.randn(8, 6) if not name.endswith("layernorm.weight") else torch.randn(6)
    assert torch.equal(join_tp_shards(name, [slice_for_tp(name, full, r, 2) for r in range(2)]), full)


def test_tp_must_divide_the_sharded_dimensions():
    check_tp_divisible(CFG, 2)
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        check_tp_divisible(CFG, 4)


def test_global_layer_name_adds_the_stage_offset():
    assert global_layer_name("decoder.layers.1.mlp.linear_fc2.weight", 12) == "decoder.layers.13.mlp.linear_fc2.weight"
    assert global_layer_name("output_layer.weight", 12) == "output_layer.weight"
