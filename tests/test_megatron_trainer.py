NUM_GPUS = 0
"""The megatron-core trainer on CPU over gloo, two spawned ranks (tests/megatron_cpu.py
holds the CUDA shims; they are applied only inside those ranks).

One run per module does, on both ranks:
  TP=2 (DP=1)  build from megatron's own init; export HF weights in buckets; full
               logits; layout + local weights; a dist_checkpointing save; one GRPO step
  TP=1 (DP=2)  a fresh model reloaded from that dist_checkpointing save (megatron's own
               resharding: the reference for ours); layout + local weights; a model
               loaded from the exported HF weights; one GRPO step on each DP half

and the tests below compare with the native engines in this process. A recording
stand-in for the optimizer takes the reduced gradients (compared with the native
trainer's); megatron's own optimizer runs under the shims in
test_megatron_core_optimizer.py and test_megatron_reshard.py, and offload to CPU
memory is a GPU-only path, not checked here.

dist_checkpointing pickles (torch.save) internally; it is used only here, as the
reference for the TP=2 -> TP=1 reshard, never in product code.
"""
import dataclasses
import json
import os

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from dynarl.components.extras import is_available
from dynarl.components.model.io import load_weights
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.trainer.megatron.convert import hf_to_megatron, slice_for_tp
from dynarl.components.trainer.megatron.layout import ShardedLayout, plan_copies
from dynarl.components.trainer.megatron.sharded_state import apply_copies
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.core.reshard_plan import plan_reshard
from test_trainer import MODEL, make_batch, make_config, one_torch_thread, step_gradients  # noqa: F401  (autouse)

pytestmark = pytest.mark.skipif(not is_available("megatron"),
                                reason="megatron-core not installed: pip install 'dynarl[megatron]'")

BATCH_SEED = 21
PROBE_IDS = torch.randint(3, MODEL.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
STEP_CONFIG = dict(lr=0.0, grad_clip=0.0)  # the recording optimizer leaves weights alone; native must too


def _ranks(rank: int, world: int, out: str) -> None:
    from megatron.core import dist_checkpointing, parallel_state

    from dynarl.components.trainer.megatron.config import MegatronConfig
    from dynarl.components.trainer.megatron.trainer import MegatronTrainer
    from megatron_cpu import RecordingOptimizer

    def trainer(tp: int, seed: int, **kwargs) -> MegatronTrainer:
        # use_distributed_optimizer=False: DDP then all-reduces every gradient (with it,
        # each DP rank gets only its reduce-scattered shard, for an optimizer we cannot build)
        cfg = MegatronConfig(tensor_parallel_size=tp, dtype="float32", use_cpu_initialization=True, seed=seed,
                             use_distributed_optimizer=False)
        return MegatronTrainer(MODEL, make_config(**STEP_CONFIG), cfg, optimizer_factory=RecordingOptimizer, **kwargs)

    def weights(t: MegatronTrainer) -> dict[str, torch.Tensor]:
        return {n: w.clone().contiguous() for n, w in t.local_weights().items()}

    ckpt = os.path.join(out, "dist_ckpt")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    t2 = trainer(2, seed=11)
    buckets = list(t2.named_weights(bucket_bytes=64 * 1024))
    hf = {name: t.clone() for bucket in buckets for name, t in bucket}
    layout2 = t2.layout()
    if rank == 0:
        save_file(hf, os.path.join(out, "hf.safetensors"))
        with open(os.path.join(out, "tp2_layout.json"), "w") as f:
            json.dump({"layout": layout2.to_wire(), "bucket_sizes": [len(b) for b in buckets]}, f)
    save_file(weights(t2), os.path.join(out, f"tp2_rank{rank}.safetensors"))
    if rank == 0:
        os.makedirs(ckpt)
    dist.barrier()
    dist_checkpointing.save(t2.model.sharded_state_dict(), ckpt)
    logits2 = t2.full_logits(PROBE_IDS)
    metrics2 = t2.train_step(make_batch(BATCH_SEED))
    save_file({"logits": logits2.contiguous(), **{f"grad.{n}": g for n, g in t2.optimizer.grads.items()}},
              os.path.join(out, f"tp2_rank{rank}.results.safetensors"))

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    t1 = trainer(1, seed=99)  # a different init, replaced by the reload
    state = t1.model.sharded_state_dict()
    t1.model.load_state_dict(dist_checkpointing.load(state, ckpt))
    save_file(weights(t1), os.path.join(out, f"tp1_rank{rank}.safetensors"))
    layout1 = t1.layout()
    if rank == 0:
        with open(os.path.join(out, "tp1_layout.json"), "w") as f:
            json.dump({"layout": layout1.to_wire()}, f)
    from_hf = trainer(1, seed=7, hf_weights=load_file(os.path.join(out, "hf.safetensors")))
    from_hf.offload()
    try:
        from_hf.train_step(make_batch(BATCH_SEED))
        refused = False
    except RuntimeError:
        refused = True
    from_hf.onload()
    logits1 = from_hf.full_logits(PROBE_IDS)
    metrics1 = from_hf.train_step(make_batch(BATCH_SEED).shard(from_hf.dp_rank, from_hf.dp_size))
    save_file({"logits": logits1.contiguous(), **{f"weight.{n}": w for n, w in weights(from_hf).items()},
               **{f"grad.{n}": g for n, g in from_hf.optimizer.grads.items()}},
              os.path.join(out, f"tp1_rank{rank}.results.safetensors"))
    with open(os.path.join(out, f"metrics_rank{rank}.json"), "w") as f:
        json.dump({"tp2": dataclasses.asdict(metrics2), "tp1": dataclasses.asdict(metrics1),
                   "offloaded_step_refused": refused,
                   "dp": [from_hf.dp_rank, from_hf.dp_size]}, f)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from megatron_cpu import spawn_ranks

    out = tmp_path_factory.mktemp("megatron")
    result = spawn_ranks(_ranks, 2, str(out), error_dir=str(out), timeout_s=600)  # a hang bound
    result["out"] = out
    if result["exitcodes"] != [0, 0]:
        pytest.fail(f"ranks failed: {result['exitcodes']}\n" + "\n".join(result["errors"].values()))
    result["metrics"] = [json.loads((out / f"metrics_rank{r}.json").read_text()) for r in range(2)]
    return result


@pytest.fixture(scope="module")
def native(run):
    """The native model loaded from the megatron model's exported HF weights, and one
    native GRPO step (lr 0) on the same batch: its metrics and per-HF-name gradients."""
    hf = load_file(str(run["out"] / "hf.safetensors"))
    model = Qwen2ForCausalLM(MODEL)
    load_weights(model, hf.items(), strict=True)
    with torch.no_grad():
        logits = model(PROBE_IDS)
    trainer = NativeTrainer(model, make_config(**STEP_CONFIG))
    metrics, grads = step_gradients(trainer, make_batch(BATCH_SEED))
    return {"hf": hf, "logits": logits, "metrics": dataclasses.asdict(metrics),
            "grads": dict(hf_to_megatron(grads, MODEL))}


def _load(run, name):
    return load_file(str(run["out"] / name))


def test_ranks_exit_cleanly_and_are_reaped(run):
    """(How long the ranks took is no bound here: a loaded machine stretches it; a hang
    runs into spawn_ranks' timeout and fails the exit codes.)"""
    for pid in run["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    print(f"the ranks ran {run['seconds']:.1f} s")


def test_hf_export_comes_in_buckets_and_loads_strictly(run, native):
    info = json.loads((run["out"] / "tp2_layout.json").read_text())
    assert len(info["bucket_sizes"]) > 1  # 64 KiB buckets split the 2 MB model
    assert set(native["hf"]) == {n for n, _ in Qwen2ForCausalLM(MODEL).named_parameters()}


@pytest.mark.parametrize("tp", [2, 1])
def test_logits_equal_the_native_model_on_converted_weights(run, native, tp):
    for rank in range(2):
        logits = _load(run, f"tp{tp}_rank{rank}.results.safetensors")["logits"]
        torch.testing.assert_close(logits, native["logits"], rtol=0, atol=2e-5)


@pytest.mark.parametrize("tp", [2, 1])
def test_grpo_step_matches_the_native_trainer(run, native, tp):
    """TP=2: both ranks hold slices of one model; TP=1: two DP ranks, each half the batch,
    gradients summed by megatron DDP. Metrics are global, gradients equal the native
    trainer's after the same HF -> megatron conversion and TP slicing."""
    for rank in range(2):
        metrics = run["metrics"][rank][f"tp{tp}"]
        for key in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "tokens"):
            assert metrics[key] == pytest.approx(native["metrics"][key], rel=1e-5, abs=1e-7), key
        results = _load(run, f"tp{tp}_rank{rank}.results.safetensors")
        tp_rank = rank if tp == 2 else 0
        for name, full in native["grads"].items():
            expected = slice_for_tp(name, full, tp_rank, tp)
            torch.testing.assert_close(results[f"grad.{name}"], expected, rtol=1e-4, atol=1e-6, msg=name)  # seen: 5e-8
    assert [m["dp"] for m in run["metrics"]] == [[0, 2], [1, 2]]


def test_offloaded_trainer_refuses_to_train(run):
    assert all(m["offloaded_step_refused"] for m in run["metrics"])


def test_tp2_to_tp1_reslice_equals_dist_checkpointing_reload(run):
    """Our plan, executed on the TP=2 ranks' tensors, rebuilds each TP=1 rank's weights
    exactly as megatron's own dist_checkpointing reload does."""
    old = ShardedLayout.from_wire(json.loads((run["out"] / "tp2_layout.json").read_text())["layout"])
    new = ShardedLayout.from_wire(json.loads((run["out"] / "tp1_layout.json").read_text())["layout"])
    assert (old.tensor_parallel_size, old.data_parallel_size) == (2, 1)
    assert (new.tensor_parallel_size, new.data_parallel_size) == (1, 2)
    # core's planner takes the same layouts: every element of every weight moves once
    transfers = plan_reshard(old.to_shards(), new.to_shards(), new.extents())
    assert sum(t.numel for t in transfers) == new.total_numel == old.total_numel
    sources = {r: _load(run, f"tp2_rank{r}.safetensors") for r in range(2)}
    copies = plan_copies(old, new)
    for rank in range(2):
        reloaded = _load(run, f"tp1_rank{rank}.safetensors")
        rebuilt = {n: torch.full_like(t, float("nan")) for n, t in reloaded.items()}
        moved = apply_copies(copies, sources, rank, rebuilt)
        assert moved == sum(t.numel() for t in reloaded.values())  # every element written once
        for name, tensor in reloaded.items():
            assert torch.equal(rebuilt[name], tensor), name


def test_hf_load_equals_dist_checkpointing_reload(run):
    for rank in range(2):
        reloaded = _load(run, f"tp1_rank{rank}.safetensors")
        results = _load(run, f"tp1_rank{rank}.results.safetensors")
        for name, tensor in reloaded.items():
            assert torch.equal(results[f"weight.{name}"], tensor), name
