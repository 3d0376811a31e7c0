"""The embodied workload in `dynarl sim`: the embodied workflow of `dynarl train` on
emulated workers, on each policy's placement (components/placement/embodied.py)."""
from __future__ import annotations

import json

import pytest

from dynarl.components.embodied.workers import Trajectory
from dynarl.components.placement.embodied import (EmbodiedCosts, EmbodiedPlacement, candidates, colocated, even,
                                                  hybrid, place_policy, predict, spatial)
from dynarl.components.workflows.embodied import split_envs
from dynarl.launch.cli import main as dynarl_main
from dynarl.launch.sim.embodied import run_policy
from dynarl.launch.sim.scenario import SimConfig, build_scenario

COSTS = EmbodiedCosts(envs=64, acts=10, env_s=0.02, act_s=0.01, train_s=40.0, switch_s=2.0)


@pytest.mark.parametrize("total, parts, counts", [
    (64, 8, (8,) * 8),
    (10, 4, (3, 3, 2, 2)),
    (5, 5, (1,) * 5),
])
def test_even(total, parts, counts):
    assert even(total, parts) == counts


def test_even_refuses_more_workers_than_envs():
    with pytest.raises(ValueError, match="cannot be dealt"):
        even(3, 4)


@pytest.mark.parametrize("policy, env, rollout, trainer", [
    ("colocated", range(8), range(8), range(8)),
    ("hybrid", range(0, 5), range(5, 8), range(8)),          # env:act work 2:1, the learner everywhere
    ("spatial", range(0, 2), range(2, 3), range(3, 8)),      # work 12.8 : 6.4 : 40 -> 1.7 : 0.9 : 5.4
    ("dynarl", range(0, 5), range(5, 7), range(7, 8)),       # the learner on its fewest (1), env:act 2:1 on 7
])
def test_policy_placements(policy, env, rollout, trainer):
    p = place_policy(policy, 8, COSTS)
    assert (p.env, p.rollout, p.trainer) == (tuple(env), tuple(rollout), tuple(trainer))
    assert sum(p.envs) == COSTS.envs
    assert p.stages == (1 if policy == "colocated" else 2)  # apart, each env worker pipelines 2 chunks


@pytest.mark.parametrize("placement, seconds", [
    # colocated: each device steps its 8 envs (0.16 s) and acts for them (0.08 s); training on 8; two switches
    (colocated(8, 64), 10 * (0.16 + 0.08) + 40.0 / 8 + 4.0),
    # hybrid, 4 env workers of 16 envs in 2 chunks of 8: an env device steps 16 envs a step (0.32 s), a
    # policy rank acts for 2 chunks (0.16 s), a chunk's own step and act 0.24 s
    (hybrid(8, 64, 4), 10 * 0.32 + 40.0 / 8 + 4.0),
    # the same in one chunk per worker: each chunk steps then acts, 16 x 0.03 s
    (hybrid(8, 64, 4, stages=1), 10 * 0.48 + 40.0 / 8 + 4.0),
    # 6 env workers (11, 11, 11, 11, 10, 10 envs) in chunks (6, 5, ..., 5, 5), each to the policy rank
    # acting for the fewest envs so far: 32 envs a step each
    (hybrid(8, 64, 6), 10 * 32 * 0.01 + 40.0 / 8 + 4.0),
    # spatial: 2 env workers of 32 envs (0.64 s a step), no switch, training on 4 devices
    (spatial(8, 64, 2, 2), 10 * 0.64 + 40.0 / 4),
])
def test_predict(placement, seconds):
    assert predict(placement, COSTS) == pytest.approx(seconds)


@pytest.mark.parametrize("placement, chunks", [
    # colocated: one chunk per worker, acted for on its own device
    (EmbodiedPlacement("colocated", (0, 1), (0, 1), (0, 1), (3, 2)), [(0, 0, 3, 0), (1, 0, 2, 1)]),
    # apart: each worker's envs in 2 chunks, each to the policy rank acting for the fewest envs so far
    (EmbodiedPlacement("hybrid", (0, 1), (2, 3, 4), (0, 1, 2, 3, 4), (3, 4), stages=2),
     [(0, 0, 2, 0), (0, 2, 1, 1), (1, 0, 2, 2), (1, 2, 2, 1)]),
])
def test_chunks(placement, chunks):
    assert [(c.worker, c.first, c.count, c.rank) for c in placement.chunks(0)] == chunks


def test_rlinf_auto_takes_the_least_predicted_placement():
    chosen = place_policy("rlinf-auto", 8, COSTS)
    assert predict(chosen, COSTS) == min(predict(p, COSTS) for p in candidates(8, COSTS.envs))
    env_bound = EmbodiedCosts(envs=64, acts=10, env_s=0.5, act_s=0.01, train_s=1.0, switch_s=2.0)
    # envs on every device, switches cheap beside them
    assert place_policy("rlinf-auto", 8, env_bound).mode == "colocated"
    train_light = EmbodiedCosts(envs=64, acts=10, env_s=0.02, act_s=0.02, train_s=0.1, switch_s=2.0)
    assert place_policy("rlinf-auto", 8, train_light).mode == "spatial"  # no role switch is worth the learner's devices


def test_split_envs_gives_each_learner_rank_its_envs():
    tr = Trajectory(obs=[[[float(i)] for i in range(5)]] * 2, actions=[[[0.0]] * 5] * 2, logprobs=[[0.0] * 5] * 2,
                    rewards=[[float(i) for i in range(5)]] * 2, terminated=[[False] * 5] * 2,
                    truncated=[[False] * 5] * 2, final_obs=[[None] * 5] * 2, last_obs=[[float(i)] for i in range(5)])
    parts = split_envs(tr, 2)
    assert [p.rewards[0] for p in parts] == [[0.0, 1.0], [2.0, 3.0, 4.0]]
    assert [len(p.last_obs) for p in parts] == [2, 3]
    assert split_envs(tr, 1) == [tr]
    with pytest.raises(ValueError, match="cannot be split"):
        split_envs(tr, 6)


def test_placement_checks_its_env_counts():
    with pytest.raises(ValueError, match="env counts"):
        EmbodiedPlacement("hybrid", (0, 1), (2,), (2,), (4,))
    with pytest.raises(ValueError, match="pipeline stages"):
        EmbodiedPlacement("hybrid", (0, 1), (2,), (2,), (4, 1), stages=2)


def test_the_workflow_runs_each_placement_as_the_planner_predicts():
    """The planner's model against the executed workflow (emulated workers, virtual time)."""
    scn = build_scenario(SimConfig(workload="embodied", devices=8, policies=("colocated", "spatial", "hybrid"),
                                   iterations=2))
    for name in ("colocated", "spatial", "hybrid"):
        m = run_policy(scn, name)
        assert m["iter_time_s"] == pytest.approx(m["predicted_s"], rel=0.06), name
        assert m["iter_time_s"] >= scn.bound_s
        assert m["env_steps_per_s"] == pytest.approx(scn.costs.envs * scn.workload.horizon / m["iter_time_s"])
        assert 0.0 < m["gpu_idle_frac"] < 1.0


def test_sim_cli_embodied_is_deterministic(capsys):
    argv = ["sim", "--workload", "embodied", "--devices", "8", "--policies", "colocated,hybrid,rlinf-auto",
            "--json", "--jobs", "1"]
    assert dynarl_main(argv) == 0
    first = capsys.readouterr().out
    assert dynarl_main(argv) == 0
    assert capsys.readouterr().out == first
    result = json.loads(first)
    assert result["kind"] == "embodied" and result["envs"] == 128
    assert set(result["policies"]) == {"colocated", "hybrid", "rlinf-auto"}
    auto = result["policies"]["rlinf-auto"]
    assert auto["iter_time_s"] <= min(m["iter_time_s"] for m in result["policies"].values()) * 1.05


@pytest.mark.parametrize("env, policy, learner, moves", [
    ({0, 1}, {2}, (3,), (("env", "trainer", 2), ("rollout", "trainer", 1))),  # apart: all lent to the learner
    (set(range(4)), set(range(4)), (0, 1, 2, 3), None),                       # colocated: it holds them all
    ({0, 1}, {2, 3}, (0, 1, 2, 3), None),                                     # hybrid: the same
])
def test_at_the_barrier_the_learner_takes_the_finished_devices_it_does_not_hold(env, policy, learner, moves):
    from dynarl.components.workflows.embodied_barrier import barrier_view
    from dynarl.core.scheduler.policy import DynarlConfig, decide_dynarl
    from dynarl.core.scheduler.predictor import Predictor, ThroughputModel
    view = barrier_view(env, policy, learner, sequences=1000.0, now=0.0, move_cost_s=1.0)
    plan = decide_dynarl(view, Predictor({"trainer": ThroughputModel([(1, 100.0), (2, 200.0)])}),
                         DynarlConfig(charge_move_cost=False))
    assert (plan.moves if plan is not None else None) == moves
    if plan is not None:
        assert plan.barrier and plan.allocation["trainer"] == 4


def test_dynarl_on_the_embodied_workload_trains_on_every_device_at_the_barrier():
    """dynarl's start: the learner on the fewest devices, env workers and policy apart on
    the rest; at each iteration's barrier the scheduler lends the learner every other
    device (two moves: there and back, each the learner's state over one link and a role
    switch). The iteration: the rollout, the step on all devices, the two moves, the sync."""
    scn = build_scenario(SimConfig(workload="embodied", devices=8, policies=("colocated", "dynarl"), iterations=2))
    m = run_policy(scn, "dynarl")
    assert m["moves_per_iteration"] == 2 and m["predicted_s"] is None
    c, stage = scn.costs, m["stage_s"]
    from dynarl.components import costmodel
    from dynarl.components.trainer.emulated.engine import EmulatedTrainerConfig, full_state_bytes
    move = full_state_bytes(EmulatedTrainerConfig(model=scn.workload.model, device=scn.config.device)) \
        / costmodel.get_device(scn.config.device).link_bandwidth + costmodel.role_switch_time()
    assert stage["trainer_s"] == pytest.approx(c.train_s / 8 + 2 * move, rel=0.02)
    assert m["iter_time_s"] == pytest.approx(stage["rollout_s"] + stage["trainer_s"] + stage["sync_s"], rel=0.01)
    spatial = run_policy(scn, "spatial")  # the same env steps
    assert m["env_steps_per_s"] * m["iter_time_s"] == pytest.approx(spatial["env_steps_per_s"] * spatial["iter_time_s"])



def test_the_barrier_rule_charged_its_moves_declines_when_they_cost_more_than_they_save():
    from dynarl.components.workflows.embodied_barrier import barrier_view
    from dynarl.core.scheduler.policy import DynarlConfig, decide_dynarl
    from dynarl.core.scheduler.predictor import Predictor, ThroughputModel
    rates = Predictor({"trainer": ThroughputModel([(1, 100.0), (2, 200.0)])})
    # 1000 sequences on 1 device: 10 s; on 4: 2.5 s. A round trip of 7 s pays, of 8 s not
    for move_cost, moves in ((7.0, True), (8.0, False)):
        view = barrier_view({0, 1}, {2}, (3,), sequences=1000.0, now=0.0, move_cost_s=move_cost)
        assert (decide_dynarl(view, rates, DynarlConfig(charge_move_cost=True)) is not None) is moves
