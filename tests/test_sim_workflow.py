NUM_GPUS = 0
"""`dynarl sim` runs `dynarl train`'s GRPO workflow (components/workflows/grpo.py):
the real rollout, reward, inference and trainer workers on emulated engines, in
virtual time, for every policy (the online ones with the job's own scheduler)."""

import pytest

from dynarl.components.workflows import pipeline
from dynarl.components.workflows.grpo import GRPO
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.launch.sim import runner
from dynarl.launch.sim.scenario import SimConfig, build_scenario

SMALL = dict(workload="math-1.5b", devices=16, prompts=8, iterations=2, warmup=1)


def test_the_workflow_is_the_trainers_and_it_checks_every_sample(monkeypatch):
    """The run goes through GRPO.step and its exactly-once check (pipeline.py): a trainer that
    dropped a sample fails the run."""
    steps = []
    real_step = GRPO.step

    async def step(self, i):
        steps.append(i)
        return await real_step(self, i)
    monkeypatch.setattr(GRPO, "step", step)
    scn = build_scenario(SimConfig(**SMALL, policies=("spatial",)))
    run = runner.run_policy(scn, "spatial")
    assert steps == [0, 1] and len(run.iterations) == 2

    def drop_one(ledger, step, ids, trained):
        trained.ids.pop()
        return real_check(ledger, step, ids, trained)
    real_check = pipeline.check_trained
    monkeypatch.setattr(pipeline, "check_trained", drop_one)
    with pytest.raises(RuntimeError, match="the trainer took 127 samples"):
        runner.run_policy(scn, "spatial")


def test_hooks_can_hold_a_stage_and_add_a_rank_while_the_step_runs():
    """What a scheduler moving devices does with a streaming step (components/workflows/
    live.py): the trainer's stage waits at its gate while its devices are lent; a new
    trainer rank joins the running stage, gets its own END, and trains its share; every
    sample is trained exactly once."""
    import asyncio
    import contextlib

    import dynarl
    from dynarl.components.placement.plan import spatial
    from dynarl.launch.sim.scenario import train_config

    scn = build_scenario(SimConfig(**SMALL, policies=("spatial",)))
    placement = spatial({"rollout": 10, "inference": 2, "trainer": 4})
    seen = {}

    class Hooks:  # what DynamicScheduling does with the step, by hand
        async def begin(self, live, groups):
            self.gate = live.gate("trainer")
            live.rollout_lock = False

        def start(self, live, label):
            self.task = asyncio.ensure_future(self.during(live))

        async def during(self, live):
            await asyncio.sleep(20)
            seen["gate_open_before"] = self.gate.done()
            init = dict(wf.g.trainer.handles[0].spec.init_kwargs)
            extra = await ctl.spawn(wf.g.trainer.cls, name="trainer-extra", devices=[15], init=init)
            await extra.call(TrainerWorker.start, None)
            call = extra.call(TrainerWorker.train_stream, "experience", None)
            live.add_rank(ctl, "trainer", _first(call))
            self.gate.set_result(None)

        async def stop(self, raise_failure=True):
            self.task.cancel()

        async def end(self, label, **measured):
            await self.task
            return {}

        def busy(self, name):
            return contextlib.nullcontext()

    async def workflow(c):
        nonlocal ctl, wf
        ctl = c
        wf = await runner.start(ctl, scn, placement)
        wf.scheduling = Hooks()
        await wf.step(0)
        return wf.stage_stats.trainer

    ctl = wf = None
    results = dynarl.run(workflow, train_config(scn, placement).runtime, virtual_time=True)
    assert seen == {"gate_open_before": False}
    assert len(results) == placement.num_ranks("trainer") + 1
    ids = [i for r in results for i in r.trained.ids]
    assert len(ids) == len(set(ids)) == sum(len(g.samples) for g in scn.batches[0])
    assert results[-1].trained.ids and all(r.trained.ids for r in results)  # the new rank trained its share too


async def _first(call):
    return (await call)[0]
