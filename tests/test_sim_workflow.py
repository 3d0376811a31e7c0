NUM_GPUS = 0
"""`dynarl sim` runs `dynarl train`'s GRPO workflow (components/workflows/grpo.py):
the real rollout, reward, inference and trainer workers on emulated engines, in
virtual time. Until the online policies move onto it too, the simulator's own
harness (launch/sim/dynarl_harness.py) still runs them; for the static policies both
exist, and here they must agree."""

import pytest

from dynarl.components.workflows.grpo import GRPO
from dynarl.launch.sim import runner
from dynarl.launch.sim.dynarl_harness import run_online
from dynarl.launch.sim.scenario import SimConfig, build_scenario

SMALL = dict(workload="math-1.5b", devices=16, prompts=8, iterations=2, warmup=1)


@pytest.mark.parametrize("policy", ["colocated", "spatial"])
def test_the_workflow_run_equals_the_simulators_own_copy(policy):
    scn = build_scenario(SimConfig(**SMALL, policies=(policy,)))
    ours, theirs = runner.run_policy(scn, policy), run_online(scn, policy)
    # The workflow's engines load the policy's weights before the first step (the
    # simulator's own started with them): iteration 0, not measured, is that much longer.
    first = ours.iterations[0].end - ours.iterations[0].start - (theirs.iterations[0].end - theirs.iterations[0].start)
    assert 0 <= first < 0.1
    for a, b in zip(ours.iterations[1:], theirs.iterations[1:], strict=True):
        assert a.end - a.start == pytest.approx(b.end - b.start, rel=1e-6)
        assert a.busy_device_s == pytest.approx(b.busy_device_s, rel=1e-6)
        assert a.stage_s == pytest.approx(b.stage_s, rel=1e-6)
        assert a.span_s == pytest.approx(b.span_s, rel=1e-6)


def test_the_workflow_is_the_trainers_and_it_checks_every_sample(monkeypatch):
    """The run goes through GRPO.step and its exactly-once check: a trainer that
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

    def drop_one(self, step, ids, trained):
        trained.ids.pop()
        return real_check(self, step, ids, trained)
    real_check = GRPO.check_trained
    monkeypatch.setattr(GRPO, "check_trained", drop_one)
    with pytest.raises(RuntimeError, match="the trainer took 127 samples"):
        runner.run_policy(scn, "spatial")
