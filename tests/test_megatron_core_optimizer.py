NUM_GPUS = 0
"""megatron-core's own DistributedOptimizer (bfloat16 model: fp32 main weights; its
norms are fp32 parameters, so an optimizer group mixes both) behind dynarl's state
export (components/trainer/megatron/core_optimizer.py), on spawned gloo ranks under
tests/megatron_cpu.py's CUDA shims:

  mapping     each rank's main-weight shard is its flat range of its own parameter
              (megatron's model_param_group_index_map would hand a norm another
              parameter's state here), the moments are that range's size, and the
              ranges of the two DP ranks tile every parameter
  checkpoint  DP=2 saved -> loaded at TP=2 (resharded: the state's flat ranges to the
              new boxes) -> saved -> loaded at DP=2 again: every state tensor bitwise the
              one saved, and the next step bitwise that of the trainer that never stopped
  offloaded   float32 (no main_param exported: the main shards are views of the
              weights) after an offload/onload detached the main shards, as megatron's
              offload_to_cpu/restore_from_cpu do on a GPU: a checkpoint loaded, the next
              step bitwise the uninterrupted trainer's
"""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from dynarl.components.extras import is_available
from test_trainer import MODEL, make_batch, make_config, one_torch_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.skipif(not is_available("megatron"),
                                reason="megatron-core not installed: pip install 'dynarl[megatron]'")

FIRST, SECOND = 31, 32  # batch seeds


def _trainer(tp: int, dtype: str = "bfloat16"):
    from dynarl.components.trainer.megatron.config import MegatronConfig
    from dynarl.components.trainer.megatron.trainer import MegatronTrainer
    return MegatronTrainer(MODEL, make_config(), MegatronConfig(
        tensor_parallel_size=tp, dtype=dtype, use_cpu_initialization=True, seed=5,
        use_distributed_optimizer=True, optimizer="megatron"))


def _state(t) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in t.export_state_shard().items()}


def _first(rank: int, world: int, out: str) -> None:
    t = _trainer(tp=1)
    t.train_step(make_batch(FIRST).shard(t.dp_rank, t.dp_size))
    state = _state(t)
    ranges = t.optimizer.owned_ranges()
    rows = []
    for name, p in t.model.named_parameters():
        start, end = ranges.get(name, (0, 0))
        main = state[f"main_param/{name}"]
        rows.append([name, start, end, p.numel(), main.numel(), state[f"exp_avg/{name}"].numel(),
                     bool(torch.equal(main.to(p.dtype), p.detach().reshape(-1)[start:end]))])
    with open(os.path.join(out, f"ranges{rank}.json"), "w") as f:
        json.dump(rows, f)
    t.save_checkpoint(os.path.join(out, "dp2"))
    save_file(state, os.path.join(out, f"state{rank}.safetensors"))
    t.train_step(make_batch(SECOND).shard(t.dp_rank, t.dp_size))
    save_file({n: w.clone() for n, w in t.local_weights().items()}, os.path.join(out, f"uninterrupted{rank}.safetensors"))


def _through_tp2(rank: int, world: int, out: str) -> None:
    t = _trainer(tp=2)
    t.load_checkpoint(os.path.join(out, "dp2"))
    t.save_checkpoint(os.path.join(out, "tp2"))


def _back(rank: int, world: int, out: str) -> None:
    t = _trainer(tp=1)
    t.load_checkpoint(os.path.join(out, "tp2"))
    save_file(_state(t), os.path.join(out, f"back{rank}.safetensors"))
    t.train_step(make_batch(SECOND).shard(t.dp_rank, t.dp_size))
    save_file({n: w.clone() for n, w in t.local_weights().items()}, os.path.join(out, f"resumed{rank}.safetensors"))


def _offloaded(rank: int, world: int, out: str) -> None:
    t = _trainer(tp=1, dtype="float32")
    t.train_step(make_batch(FIRST).shard(t.dp_rank, t.dp_size))
    t.save_checkpoint(os.path.join(out, "fp32"))
    t.train_step(make_batch(SECOND).shard(t.dp_rank, t.dp_size))
    uninterrupted = {n: w.clone() for n, w in t.local_weights().items()}
    for group in t.optimizer.optimizer.param_groups:  # what offload_to_cpu + restore_from_cpu leave on a GPU
        for main in group["params"]:
            main.data = main.data.clone()
    t.load_checkpoint(os.path.join(out, "fp32"))
    t.train_step(make_batch(SECOND).shard(t.dp_rank, t.dp_size))
    differ = [n for n, w in t.local_weights().items() if not torch.equal(w, uninterrupted[n])]
    with open(os.path.join(out, f"offloaded{rank}.json"), "w") as f:
        json.dump(differ, f)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from megatron_cpu import spawn_ranks
    from conftest import assert_reaped

    out = tmp_path_factory.mktemp("core_optimizer")
    pids = []
    for fn in (_first, _through_tp2, _back, _offloaded):
        result = spawn_ranks(fn, 2, str(out), error_dir=str(out))
        pids += result["pids"]
        assert result["exitcodes"] == [0, 0], result["errors"]
    assert_reaped(pids)
    return out


def test_each_rank_holds_its_own_range_of_each_parameter(run):
    rows = [json.loads((run / f"ranges{r}.json").read_text()) for r in range(2)]
    for mine, other in zip(*rows):
        name, start, end, numel, main, moments, equal = mine
        assert main == moments == end - start and equal, (name, mine)
        spans = sorted(s for s in [(start, end), (other[1], other[2])] if s[1] > s[0])  # the two DP ranks' ranges
        assert spans[0][0] == 0 and spans[-1][1] == numel and all(a[1] == b[0] for a, b in zip(spans, spans[1:])), name
    assert any(0 < r[2] - r[1] < r[3] for r in rows[0])  # some parameter is split across the two


def test_state_survives_a_round_trip_through_tp2_bitwise(run):
    for r in range(2):
        saved, back = load_file(run / f"state{r}.safetensors"), load_file(run / f"back{r}.safetensors")
        assert saved.keys() == back.keys() and {"main_param", "exp_avg", "exp_avg_sq"} <= {
            k.split("/")[0] for k in saved}
        assert [k for k in saved if not torch.equal(saved[k], back[k])] == []
        assert int(saved["adam_step"]) == 1


def test_the_resumed_step_is_bitwise_the_uninterrupted_one(run):
    for r in range(2):
        a, b = load_file(run / f"uninterrupted{r}.safetensors"), load_file(run / f"resumed{r}.safetensors")
        assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_a_float32_load_reaches_main_shards_an_offload_detached(run):
    for r in range(2):
        assert json.loads((run / f"offloaded{r}.json").read_text()) == []


def test_format_1_checkpoints_are_still_read(tmp_path):
    from dynarl.components.trainer.megatron import checkpoint

    for version, readable in ((1, True), (2, True), (3, False)):
        (tmp_path / checkpoint.META_FILE).write_text(json.dumps({"format_version": version, "step": 4}))
        if readable:
            assert checkpoint.read_meta(str(tmp_path))["step"] == 4
        else:
            with pytest.raises(ValueError, match="format_version 3"):
                checkpoint.read_meta(str(tmp_path))
