"""LoRA (model.lora): the adapted model starts as the base, trains only its adapters,
merges back into plain weights with its own logits, and exports a merged HF folder
plus a PEFT adapter that transformers and peft load with those logits."""
NUM_GPUS = 0

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub: every model here is built locally

import pytest
import torch

from dynarl.components.model.config import ModelConfig
from dynarl.components.model.io import load_weights, save_pretrained
from dynarl.components.model.lora import LoraLinear, apply_lora, is_adapter, merge_lora
from dynarl.components.model.lora_config import LoraConfig
from dynarl.components.model.lora_export import (ADAPTER_DIR, ADAPTER_WEIGHTS_FILE, adapter_config, adapter_state,
                                                 write_lora_export)
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.model.spec import ModelSpec, build_model, build_policy_model
from dynarl.transport.errors import ConfigError

torch.set_num_threads(2)

SMALL = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, rope_theta=5000.0, rms_norm_eps=1e-5)
"""Qwen2's shape with q/k/v biases, untied head."""
LORA = LoraConfig(rank=4, alpha=8.0)


def base_model(config: ModelConfig = SMALL, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config, init_std=0.1).eval()  # larger than default so logits are not ~0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def trained_adapters(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Non-zero B (as after training), so the adapters change the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".lora_B"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def ids(config: ModelConfig = SMALL) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))


# ---- config ---------------------------------------------------------------------

@pytest.mark.parametrize("override, field, message", [
    (("model.lora.rank", -1), "model.lora.rank", ">= 0"),
    (("model.lora.rank", 1.5), "model.lora.rank", "integer"),
    (("model.lora.alpha", 0), "model.lora.alpha", "> 0"),
    (("model.lora.dropout", 1.0), "model.lora.dropout", "[0, 1)"),
    (("model.lora.target_modules", ["q_prj"]), "model.lora.target_modules", "'q_prj' is no linear layer"),
    (("model.lora.target_modules", []), "model.lora.target_modules", "at least one"),
    (("model.lora.target_modules", ["q_proj", "q_proj"]), "model.lora.target_modules", "twice"),
    (("model.lora.rnak", 8), "model.lora.rnak", "unknown key"),
])
def test_a_bad_lora_config_names_its_field(override, field, message):
    from dynarl.components.workflows.config import load_config
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.path == field and message in str(err.value)


def test_the_cli_override_parses_and_the_spec_crosses_the_wire():
    from dynarl.components.workflows.config import load_config
    from dynarl.launch.train import parse_override
    from dynarl.transport.wire import decode_blob, encode_blob
    cfg = load_config(None, [parse_override(arg) for arg in ("model.lora.rank=8",
                                                             "model.lora.target_modules=[q_proj,v_proj]")])
    assert cfg.model.lora == LoraConfig(rank=8, target_modules=("q_proj", "v_proj"))
    assert cfg.model.lora.scaling == 16.0 / 8
    assert decode_blob(encode_blob(cfg.model)) == cfg.model
    assert not load_config(None, []).model.lora.enabled  # off by default


@pytest.mark.parametrize("overrides, field", [
    ([("model.lora.rank", 8), ("trainer.backend", "megatron")], "model.lora.rank"),
    ([("workflow", "ppo"), ("critic.model", {"lora": {"rank": 4}})], "critic.model.lora.rank"),
])
def test_lora_is_refused_where_it_would_not_apply(overrides, field):
    from dynarl.components.workflows.config import load_config
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert err.value.path == field


# ---- the layer ------------------------------------------------------------------

def test_adapted_model_starts_bitwise_as_the_base_and_keeps_hf_names():
    base = base_model()
    model = apply_lora(base_model(), LORA)
    names = [n for n, _ in model.named_parameters()]
    assert [n for n in names if not is_adapter(n)] == [n for n, _ in base.named_parameters()]
    adapted = {n.rpartition(".")[0] for n in names if is_adapter(n)}
    assert len(adapted) == SMALL.num_hidden_layers * 7 + 1 and "lm_head" in adapted  # the default: every linear
    assert all(isinstance(model.get_submodule(m), LoraLinear) for m in adapted)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {n for n in names if is_adapter(n)}
    a = model.get_submodule("model.layers.0.self_attn.q_proj").lora_A
    assert a.shape == (LORA.rank, SMALL.hidden_size) and a.abs().max() > 0
    with torch.no_grad():
        assert torch.equal(model(ids()), base(ids()))


def test_adapters_are_seeded_and_take_the_model_dtype():
    one = apply_lora(build_model(ModelSpec(), dtype=torch.bfloat16), LORA, seed=3)
    two = apply_lora(build_model(ModelSpec(), dtype=torch.bfloat16), LORA, seed=3)
    other = apply_lora(build_model(ModelSpec(), dtype=torch.bfloat16), LORA, seed=4)
    a = "model.layers.1.mlp.down_proj.lora_A"
    p1, p2, p3 = (dict(m.named_parameters())[a] for m in (one, two, other))
    assert p1.dtype == torch.bfloat16 and torch.equal(p1, p2) and not torch.equal(p1, p3)


def test_training_changes_only_the_adapters():
    model = apply_lora(base_model(), dataclasses.replace(LORA, dropout=0.1)).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    x = ids()
    for _ in range(3):
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, SMALL.vocab_size), x[:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()
    for name, p in model.named_parameters():
        if is_adapter(name):
            assert not torch.equal(p, before[name]), name
        else:
            assert p.grad is None and torch.equal(p, before[name]), name


def test_merged_weights_give_the_adapted_model_s_logits():
    model = trained_adapters(apply_lora(base_model(), LORA))
    merged = merge_lora(dict(model.named_parameters()), LORA.scaling)
    assert not any(is_adapter(n) for n in merged) and list(merged) == [n for n, _ in base_model().named_parameters()]
    plain = base_model(seed=9)
    load_weights(plain, merged.items(), strict=True)
    with torch.no_grad():
        expected = model(ids())
        assert not torch.allclose(expected, base_model()(ids()), atol=1e-3)  # the adapters count
        torch.testing.assert_close(plain(ids()), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_lora_is_w_plus_scaled_b_a(dtype):
    g = torch.Generator().manual_seed(0)
    w, a, b, bias = (torch.randn(s, generator=g).to(dtype) for s in ((5, 3), (2, 3), (5, 2), (5,)))
    out = merge_lora({"x.weight": w, "x.bias": bias, "x.lora_A": a, "x.lora_B": b, "y.weight": w}, 0.5)
    assert list(out) == ["x.weight", "x.bias", "y.weight"]
    assert out["x.weight"].dtype == dtype and out["x.bias"] is bias and out["y.weight"] is w
    expected = (w.double() + 0.5 * b.double() @ a.double()).to(dtype)
    torch.testing.assert_close(out["x.weight"], expected)  # to the dtype's rounding


@pytest.mark.parametrize("named, message", [
    ({"x.weight": torch.ones(2, 2), "x.lora_A": torch.ones(1, 2)}, "no x.lora_B"),
    ({"x.lora_A": torch.ones(1, 2), "x.lora_B": torch.ones(2, 1)}, "no x.weight"),
])
def test_merge_lora_refuses_a_broken_pair(named, message):
    with pytest.raises(ValueError, match=message):
        merge_lora(named, 1.0)


@pytest.mark.parametrize("config, target, message", [
    (SMALL, lambda m: m.model, "match no linear layer"),  # the decoder alone has no lm_head
    (dataclasses.replace(SMALL, tie_word_embeddings=True), lambda m: m, "tied"),
])
def test_apply_lora_refuses_targets_it_cannot_adapt(config, target, message):
    with pytest.raises(ValueError, match=message):
        apply_lora(target(base_model(config)), LoraConfig(rank=2, target_modules=("q_proj", "lm_head")))


def test_a_plain_model_folder_has_no_place_for_adapters(tmp_path):
    with pytest.raises(ValueError, match="lora_A is a LoRA adapter"):
        save_pretrained(apply_lora(base_model(), LORA), tmp_path)


# ---- export ---------------------------------------------------------------------

@pytest.mark.parametrize("tied", [False, True])
def test_export_loads_in_transformers_and_peft_with_our_logits(tmp_path, tied):
    import transformers
    from peft import PeftModel
    config = dataclasses.replace(SMALL, tie_word_embeddings=tied)
    save_pretrained(base_model(config), tmp_path / "base")
    model = trained_adapters(apply_lora(base_model(config), LORA)).eval()
    files = write_lora_export(dict(model.named_parameters()), config, LORA, tmp_path / "out", str(tmp_path / "base"))
    assert sorted(os.listdir(tmp_path / "out" / ADAPTER_DIR)) == ["adapter_config.json", ADAPTER_WEIGHTS_FILE]
    assert all((tmp_path / "out" / f).is_file() for f in files)
    with torch.no_grad():
        expected = model(ids())
        base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", torch_dtype=torch.float32)
        peft_model = PeftModel.from_pretrained(base, tmp_path / "out" / ADAPTER_DIR).eval()
        torch.testing.assert_close(peft_model(input_ids=ids()).logits, expected, atol=1e-4, rtol=1e-4)
        merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", torch_dtype=torch.float32)
        torch.testing.assert_close(merged.eval()(input_ids=ids()).logits, expected, atol=1e-4, rtol=1e-4)


def test_adapter_names_and_config_are_peft_s():
    model = apply_lora(base_model(), LoraConfig(rank=2, alpha=4.0, target_modules=("v_proj",)))
    state = adapter_state(dict(model.named_parameters()))
    assert sorted(state) == [f"base_model.model.model.layers.{i}.self_attn.v_proj.lora_{x}.weight"
                             for i in range(SMALL.num_hidden_layers) for x in "AB"]
    from peft import LoraConfig as PeftLoraConfig
    theirs = PeftLoraConfig(**{k: v for k, v in adapter_config(LoraConfig(rank=2, alpha=4.0), "/m").items()
                               if k != "peft_type"})
    assert (theirs.r, theirs.lora_alpha, theirs.base_model_name_or_path) == (2, 4.0, "/m")
    assert set(theirs.target_modules) == set(LoraConfig().target_modules)


def test_the_export_writes_a_lora_run_s_checkpoint_weights(tmp_path):
    """launch/export.py's step after reading the checkpoint: (name, tensor) pairs into
    the run's LoRA model, written merged plus the adapter; a checkpoint without the
    adapters is refused."""
    import transformers
    from dynarl.launch.export import ExportError, write_weights
    spec = ModelSpec(lora=LORA)
    trained = trained_adapters(build_policy_model(spec))
    weights = list(trained.named_parameters())
    written = write_weights(build_policy_model(spec), spec, weights, str(tmp_path / "out"))
    assert "adapter/adapter_model.safetensors" in written
    assert json.loads((tmp_path / "out" / ADAPTER_DIR / "adapter_config.json").read_text())["r"] == LORA.rank
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", torch_dtype=torch.float32).eval()
    x = ids(spec.config())
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=x).logits, trained(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(ExportError, match="adapters the checkpoint lacks"):
        write_weights(build_policy_model(spec), spec, [(n, t) for n, t in weights if not is_adapter(n)],
                      str(tmp_path / "out2"))


def test_the_trainer_s_saved_model_is_merged():
    """engine_factory.hf_model (what the trainer's save_model writes, e.g. the reference
    policy after warm start) of a LoRA policy: plain weights with its logits."""
    from dynarl.components.engine_factory import hf_model
    from dynarl.components.trainer.base import TrainerConfig
    from dynarl.components.trainer.native.trainer import NativeTrainer
    from dynarl.components.trainer.threaded import ThreadedTrainer
    spec = ModelSpec(lora=LORA)
    policy = trained_adapters(build_policy_model(spec))
    saved = hf_model(ThreadedTrainer(NativeTrainer(policy, TrainerConfig())), spec, 1 << 16)
    assert not any(isinstance(m, LoraLinear) for m in saved.modules())
    x = ids(spec.config())
    with torch.no_grad():
        torch.testing.assert_close(saved(x), policy(x), atol=1e-5, rtol=1e-5)


def test_the_default_targets_leave_a_tied_head_out_an_explicit_one_is_refused():
    tied = dataclasses.replace(SMALL, tie_word_embeddings=True)
    model = apply_lora(base_model(tied), LoraConfig(rank=2))
    assert not isinstance(model.lm_head, LoraLinear) and isinstance(model.model.layers[0].mlp.up_proj, LoraLinear)
    with pytest.raises(ValueError, match="tied"):
        apply_lora(base_model(tied), LoraConfig(rank=2, target_modules=("q_proj", "lm_head")))
