NUM_GPUS = 0
"""The megatron trainer (one spawned gloo rank on CPU, tests/megatron_cpu.py) with the
trainer config's learning-rate schedule and activation checkpointing:

  each step's optimizer runs at lr_at(step); a swapped-in warm-start config
  (constant_lr) runs at its own lr; a trainer loaded from a checkpoint continues the
  schedule where the saved one stood, to the same weights; full recompute
  (activation_checkpointing) gives the gradients of a plain backward.
"""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from dynarl.components.extras import is_available
from dynarl.components.trainer.lr_schedule import constant_lr, lr_at
from test_trainer import MODEL, make_batch, make_config

pytestmark = pytest.mark.skipif(not is_available("megatron"),
                                reason="megatron-core not installed: pip install 'dynarl[megatron]'")

SCHEDULE = dict(lr=1e-2, lr_schedule="cosine", lr_warmup_steps=2, lr_decay_steps=3, lr_min_ratio=0.1,
                lr_step_offset=1)  # (step 0 is a warm start's)
SAVED_AT, STEPS = 3, 5
WARM_LR = 7e-3


def _rank(rank: int, world: int, out: str) -> None:
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    from dynarl.components.trainer.megatron.adamw import LocalAdamW
    from dynarl.components.trainer.megatron.config import MegatronConfig
    from dynarl.components.trainer.megatron.trainer import MegatronTrainer
    from megatron_cpu import RecordingOptimizer

    class LoggedAdamW(LocalAdamW):
        """dynarl's AdamW, noting the lr each step runs at."""
        def __init__(self, *args):
            super().__init__(*args)
            self.lrs: list[float] = []

        def step(self):
            self.lrs.append(self.param_groups[0]["lr"])
            return super().step()

    def trainer(config, factory, seed=5, **kwargs):
        cfg = MegatronConfig(dtype="float32", use_cpu_initialization=True, seed=seed, optimizer="adamw",
                             use_distributed_optimizer=False)
        return MegatronTrainer(MODEL, config, cfg, optimizer_factory=factory, **kwargs)

    config = make_config(**SCHEDULE)
    ckpt = os.path.join(out, "ckpt")
    first = trainer(config, LoggedAdamW)
    first.config = constant_lr(config, WARM_LR)  # as the worker's warm start does (ThreadedTrainer)
    first.train_step(make_batch(100))
    first.config = config
    for step in range(1, STEPS):
        if step == SAVED_AT:
            first.save_checkpoint(ckpt)
        first.train_step(make_batch(step))
    resumed = trainer(config, LoggedAdamW, seed=6)
    resumed.load_checkpoint(ckpt)
    loaded_step = resumed.global_step
    for step in range(SAVED_AT, STEPS):
        resumed.train_step(make_batch(step))
    save_file({n: w.contiguous() for n, w in first.local_weights().items()}, os.path.join(out, "first.safetensors"))
    save_file({n: w.contiguous() for n, w in resumed.local_weights().items()},
              os.path.join(out, "resumed.safetensors"))

    torch.manual_seed(9)
    start = dict(Qwen2ForCausalLM(MODEL).state_dict())  # both start from these weights
    grads, layer_calls = {}, {}
    for recompute in (False, True):
        t = trainer(make_config(lr=0.0, activation_checkpointing=recompute), RecordingOptimizer, hf_weights=start)
        calls = [0]
        for layer in t.model.decoder.layers:  # each time a layer runs: a forward or a recompute
            layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        t.train_step(make_batch(42, num_groups=1))  # (one micro-batch)
        grads[recompute], layer_calls[str(recompute)] = t.optimizer.grads, calls[0]
    save_file({f"{k}.{n}": g.contiguous() for k, gs in grads.items() for n, g in gs.items()},
              os.path.join(out, "grads.safetensors"))
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"first": first.optimizer.lrs, "resumed": resumed.optimizer.lrs, "loaded_step": loaded_step,
                   "layer_calls": layer_calls}, f)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from megatron_cpu import spawn_ranks

    out = tmp_path_factory.mktemp("megatron_schedule")
    result = spawn_ranks(_rank, 1, str(out), error_dir=str(out), timeout_s=600)  # a hang bound
    if result["exitcodes"] != [0]:
        pytest.fail(f"rank failed: {result['exitcodes']}\n" + "\n".join(result["errors"].values()))
    result.update(json.loads((out / "result.json").read_text()), out=out)
    return result


def test_each_step_runs_at_the_scheduled_lr_and_the_warm_start_at_its_own(run):
    config = make_config(**SCHEDULE)
    assert run["first"] == [WARM_LR] + [lr_at(step, config) for step in range(1, STEPS)]
    assert len(set(run["first"])) >= 3  # the warm start's, then warmup, peak and decay


def test_a_resumed_trainer_continues_the_schedule_to_the_same_weights(run):
    assert run["loaded_step"] == SAVED_AT
    assert run["resumed"] == run["first"][SAVED_AT:]
    first, resumed = (load_file(str(run["out"] / f"{name}.safetensors")) for name in ("first", "resumed"))
    assert first.keys() == resumed.keys()
    for name, weight in first.items():
        assert torch.equal(resumed[name], weight), name


def test_activation_checkpointing_gives_the_same_gradients(run):
    grads = load_file(str(run["out"] / "grads.safetensors"))
    plain = {k.split(".", 1)[1]: g for k, g in grads.items() if k.startswith("False.")}
    recomputed = {k.split(".", 1)[1]: g for k, g in grads.items() if k.startswith("True.")}
    assert plain.keys() == recomputed.keys() and plain
    assert any(g.abs().sum() > 0 for g in plain.values())
    assert run["layer_calls"] == {"False": MODEL.num_hidden_layers, "True": 2 * MODEL.num_hidden_layers}
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, atol=1e-6, rtol=0, msg=name)
