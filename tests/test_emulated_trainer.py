NUM_GPUS = 0

import asyncio
import dataclasses
import inspect
import os

import pytest

from dynarl.components import costmodel as cm
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.components.trainer.base import STATE_NAMES, TrainBatch, TrainerConfig
from dynarl.components.trainer.engine import TrainerEngine
from dynarl.components.trainer.emulated.engine import EmulatedTrainer, EmulatedTrainerConfig
from dynarl.components.trainer.emulated.layout import build_layout, shard_ranges
from dynarl.components.trainer.threaded import ThreadedTrainer
from dynarl.core.virtual_time import run_virtual

M7, H100 = cm.get_model("qwen2.5-7b"), cm.get_device("h100-80gb")


def trainer(rank=0, world_size=1, config=None, **emulation):
    return EmulatedTrainer(config, emulation=EmulatedTrainerConfig(**emulation), rank=rank, world_size=world_size)


def batch(lengths, prompt_len=10, **kw):
    ids = [list(range(n)) for n in lengths]
    return TrainBatch(input_ids=ids, prompt_lens=[prompt_len] * len(ids), rewards=[1.0] * len(ids),
                      group_ids=[0] * len(ids), **kw)


def shape_of(config, name="tiny"):
    return cm.ModelShape(name, config.num_parameters, 0, num_layers=config.num_hidden_layers,
                         num_attention_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                         head_dim=config.head_dim, hidden_size=config.hidden_size, vocab_size=config.vocab_size,
                         intermediate_size=config.intermediate_size, tie_word_embeddings=config.tie_word_embeddings)


@pytest.mark.parametrize("tied, world_size", [
    pytest.param(False, 1, id="untied_w1"),
    pytest.param(True, 3, id="tied_w3"),
])
def test_layout_matches_the_native_trainer(tied, world_size):
    from dynarl.components.model.config import TINY_CONFIGS
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    from dynarl.components.trainer.base import shard_ranges
    from dynarl.components.trainer.native.trainer import NativeTrainer

    config = dataclasses.replace(TINY_CONFIGS["tiny-0.5m"], tie_word_embeddings=tied)
    native = NativeTrainer(Qwen2ForCausalLM(config), TrainerConfig()).layout()
    ours = build_layout(shape_of(config), world_size, dtype="float32")
    assert [(p.name, p.shape, p.offset) for p in ours.params] == [(p.name, p.shape, p.offset) for p in native.params]
    assert ours.total_numel == native.total_numel == config.num_parameters
    assert ours.shards["master"] == tuple(shard_ranges(ours.total_numel, world_size))


@pytest.mark.parametrize("name, card_params, card_non_embedding, rel", [
    pytest.param("qwen2.5-1.5b", 1.54e9, 1.31e9, 0.005, id="1.5b"),
    pytest.param("qwen2.5-7b", 7.61e9, 6.53e9, 0.005, id="7b"),
    # the card's 32.5B / 31.0B are rounded down; the architecture holds 32.76B / 31.21B
    pytest.param("qwen2.5-32b", 32.5e9, 31.0e9, 0.01, id="32b"),
])
def test_qwen_layouts_hold_the_model_card_parameter_counts(name, card_params, card_non_embedding, rel):
    model = cm.get_model(name)
    layout = build_layout(model, 8)
    embeddings = sum(p.numel for p in layout.params if "embed_tokens" in p.name or "lm_head" in p.name)
    assert layout.total_numel == pytest.approx(card_params, rel=rel)
    assert layout.total_numel - embeddings == pytest.approx(card_non_embedding, rel=rel)
    assert sum(e - s for s, e in layout.shards["grad"]) == layout.total_numel


@pytest.mark.parametrize("engine", [pytest.param(EmulatedTrainer, id="emulated"),
                                    pytest.param(ThreadedTrainer, id="threaded")])
def test_matches_the_trainer_protocol(engine):
    for name, member in inspect.getmembers(TrainerEngine, inspect.isfunction):
        if name.startswith("_"):
            continue
        ours = getattr(engine, name)
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(member).parameters), name
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(member), name


@pytest.mark.parametrize("lengths", [
    pytest.param([4096] * 8, id="uniform"),
    pytest.param([100, 2000, 8000, 300], id="ragged"),
])
def test_train_step_sleeps_the_cost_model_time(lengths):
    async def main():
        t = trainer(mfu=0.4)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        metrics = await t.train_step(batch(lengths))
        return metrics, loop.time() - t0, t.global_step

    metrics, elapsed, step = run_virtual(main())
    tokens = sum(lengths)
    expected = cm.train_time(M7, H100, tokens, sum(n * n for n in lengths) / tokens, 1, 0.4)
    assert elapsed == pytest.approx(expected, rel=1e-9) and metrics.time_s == pytest.approx(expected)
    assert step == 1 and metrics.step == 1
    assert metrics.tokens == sum(n - 10 for n in lengths)
    assert metrics.loss == metrics.pg_loss == metrics.grad_norm == 0.0  # no computation


def test_recompute_and_mfu_change_the_step_time():
    base = trainer().step_time([2048] * 4)
    assert trainer(recompute=True).step_time([2048] * 4) == pytest.approx(base * 4 / 3)
    assert trainer(mfu=0.2).step_time([2048] * 4) == pytest.approx(base * 2)


def test_train_step_refuses_what_the_native_one_refuses():
    async def main():
        t = trainer()
        await t.offload()
        with pytest.raises(RuntimeError, match="offloaded"):
            await t.train_step(batch([50]))
        await t.onload()
        with pytest.raises(ValueError, match="ref_logprobs"):
            await trainer(config=TrainerConfig(kl_coef=0.1)).train_step(batch([50]))
        with pytest.raises(ValueError, match="mask"):
            await t.train_step(batch([50], response_mask=[[0] * 40]))
        return t.global_step

    assert run_virtual(main()) == 0


def test_state_shards_are_sizes_that_tile_the_layout():
    ranks = [trainer(rank=r, world_size=3) for r in range(3)]
    shards = [t.export_state_shard() for t in ranks]
    total = ranks[0].layout().total_numel
    for name in STATE_NAMES:
        assert sum(s[name]["numel"] for s in shards) == total
        assert [(s[name]["start"], s[name]["end"]) for s in shards] == shard_ranges(total, 3)
        assert all(s[name]["nbytes"] == 4 * s[name]["numel"] for s in shards)
    assert sum(t.state_bytes for t in ranks) == 4 * 4 * total
    assert ranks[0].weight_bytes == 2 * total


async def test_import_state_shard_checks_the_owned_size_and_takes_the_step():
    src = trainer(rank=1, world_size=2)
    src.global_step = 7
    same = trainer(rank=1, world_size=2)
    await same.import_state_shard(src.export_state_shard())
    assert same.global_step == 7
    with pytest.raises(ValueError, match="owns"):
        await trainer(rank=0, world_size=3).import_state_shard(src.export_state_shard())
    with pytest.raises(ValueError, match="lacks"):
        await same.import_state_shard({"step": 1})


async def test_checkpoint_written_by_two_ranks_loads_on_three(tmp_path):
    path = str(tmp_path / "ckpt")
    for r in range(2):
        t = trainer(rank=r, world_size=2)
        t.global_step = 5
        await t.save_checkpoint(path)
    for r in range(3):
        t = trainer(rank=r, world_size=3)
        await t.load_checkpoint(path)
        assert t.global_step == 5
    with pytest.raises(ValueError, match="does not match"):
        await trainer(model="qwen2.5-1.5b").load_checkpoint(path)
    os.remove(os.path.join(path, "shard-00001-of-00002.json"))
    with pytest.raises(FileNotFoundError):
        await trainer(rank=2, world_size=3).load_checkpoint(path)


def test_named_weights_buckets_feed_the_emulated_rollout():
    t = trainer()
    bucket_bytes = 1 << 30
    buckets = list(t.named_weights(bucket_bytes))
    names = [n for b in buckets for n, _ in b]
    assert names == [p.name for p in t.layout().params]
    for b in buckets:
        assert len(b) == 1 or sum(n for _, n in b) <= bucket_bytes
    assert sum(n for b in buckets for _, n in b) == t.weight_bytes

    async def main():
        eng = EmulatedRolloutEngine(EmulatedRolloutConfig())
        for version, b in enumerate(buckets, 1):
            await eng.update_weights(b, version)
        await eng.step()
        return eng.busy_time, eng.weight_version

    busy, version = run_virtual(main())
    assert version == len(buckets)
    assert busy == pytest.approx(t.weight_bytes / H100.link_bandwidth)


def test_bad_construction_is_rejected():
    with pytest.raises(ValueError, match="rank"):
        trainer(rank=2, world_size=2)
    with pytest.raises(ValueError, match="mfu"):
        EmulatedTrainerConfig(mfu=0)
    with pytest.raises(ValueError, match="known"):
        EmulatedTrainerConfig(model="gpt2")
