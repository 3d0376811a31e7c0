NUM_GPUS = 0
"""The GRPO workflow shards a step's batch over the trainer's DP ranks by tokens when
the trainer packs its micro-batches (trainer.engine.max_tokens_per_micro_batch > 0),
run through `dynarl sim`'s emulated engines (the real workflow and workers)."""

import dataclasses

from dynarl.components.trainer.base import TrainBatch
from dynarl.components.trainer.native.packing import balance_parts
from dynarl.launch.sim import runner
from dynarl.launch.sim.scenario import SimConfig, build_scenario

SMALL = dict(workload="math-1.5b", devices=16, prompts=8, iterations=2, warmup=1)


def test_packing_trainer_gets_parts_balanced_by_tokens(monkeypatch):
    real_config, real_shard = runner.train_config, TrainBatch.shard_indices
    calls = []

    def packed(scn, placement, scheduler=None):
        cfg = real_config(scn, placement, scheduler)
        engine = dataclasses.replace(cfg.trainer.engine, max_tokens_per_micro_batch=4096)
        trainer = dataclasses.replace(cfg.trainer, engine=engine, streaming=False)  # steps through GRPO.train
        return dataclasses.replace(cfg, trainer=trainer)

    def shard_indices(self, rank, world_size, *, by_tokens=False):
        part = real_shard(self, rank, world_size, by_tokens=by_tokens)
        calls.append((by_tokens, world_size, rank, part, [len(ids) for ids in self.input_ids], self.group_ids))
        return part
    monkeypatch.setattr(runner, "train_config", packed)
    monkeypatch.setattr(TrainBatch, "shard_indices", shard_indices)
    run = runner.run_policy(build_scenario(SimConfig(**SMALL, policies=("spatial",))), "spatial")
    assert len(run.iterations) == 2
    trained = [c for c in calls if c[0]]
    assert trained and all(by_tokens for by_tokens, *_ in calls)
    assert max(world for _, world, *_ in trained) > 1  # a real split
    for _, world, rank, part, lengths, groups in trained:
        assert part == balance_parts(lengths, groups, world)[rank]
