"""A lost rollout rank is a forced donor (components/workflows/survival.py): the prompt
groups it held go back to the others through the channel's custody (transport/channel.py
Custody), a replacement takes its place, and the step goes on without a restart."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from dynarl.components.experience import END, PromptGroup
from dynarl.components.workflows.grpo import GRPO
from dynarl.components.workflows.ledger import read_entries
from dynarl.components.workflows.survival import applies, group_ident
from dynarl.core.channel_service import ChannelService
from dynarl.launch.train import prepare
from dynarl.transport.custody import Custody
from dynarl.transport.errors import ChannelClosed
from conftest import assert_reaped
from grpo_tiny import overrides
from workload_workers import DyingInferenceWorker, DyingInSyncRolloutWorker, DyingRewardWorker, DyingRolloutWorker


def _worker(name: str):
    return SimpleNamespace(spec=SimpleNamespace(worker_id=name), name=name, lost=None)


def Group(index: int) -> PromptGroup:
    return PromptGroup(index, f"p{index}", "a", [1, 2], [])


def test_custody_follows_each_group_until_the_chunk_made_of_it_is_downstream():
    service = ChannelService({})
    prompts, rollouts = service.channel("prompts"), service.channel("rollouts")
    prompts.custody = Custody(group_ident)
    rollouts.releases = prompts
    for i in range(4):
        prompts.put_nowait(Group(i))
    prompts.put_nowait(END)
    a, b = _worker("a"), _worker("b")
    take = lambda w: service.serve_now(w, "__channel__", ["get_many", "prompts", None, 1])[0][0]
    assert [take(a), take(b), take(a)] == [prompts.custody.held["a"][0].item, prompts.custody.held["b"][1].item,
                                           prompts.custody.held["a"][2].item]
    # b delivers the chunk made of group 1: the same message releases it
    service.serve_now(b, "__channel__", ["put_many", "rollouts", [["chunk", None, 1.0, None, [1]]]])
    assert dict(prompts.custody.holder) == {0: "a", 2: "a"} and len(rollouts) == 1
    # a put without idents releases nothing; a malformed row is refused
    service.serve_now(a, "__channel__", ["put_many", "rollouts", [["other", None, 1.0, None]]])
    assert set(prompts.custody.holder) == {0, 2}
    with pytest.raises(ValueError, match="rows are"):
        service.serve_now(a, "__channel__", ["put_many", "rollouts", [["x", None]]])
    assert take(a).index == 3 and take(a) is END
    # a is lost: it takes and puts no more; what it held goes back to the front, in the
    # order it took it, its END last
    a.lost = "killed"
    with pytest.raises(ChannelClosed, match="a is lost"):
        take(a)
    assert prompts.reclaim("a") == 3
    assert [take(b) for _ in range(4)][:3] == [prompts.custody.held["b"][i].item for i in (0, 2, 3)]
    assert prompts.custody.forget("b") == [0, 2, 3]  # (b's call ended holding them: not delivered)
    assert not prompts.custody.holder and len(prompts) == 0


def test_survival_applies_where_no_move_holds_ranks_of_its_own():
    def cfg(**kw):
        base = {"survive": True, "policy": "static", "oversample": 1, "staleness": 0, "workflow": "grpo",
                "launcher": "local", "dynamic": False} | kw
        return SimpleNamespace(run=SimpleNamespace(survive=base["survive"]),
                               scheduler=SimpleNamespace(policy=base["policy"]),
                               rollout=SimpleNamespace(oversample=base["oversample"]),
                               algorithm=SimpleNamespace(max_staleness=base["staleness"],
                                                         dynamic_sampling=base["dynamic"]), workflow=base["workflow"],
                               runtime=SimpleNamespace(launcher=base["launcher"]))
    assert applies(cfg()) and applies(cfg(workflow="ppo")) and applies(cfg(launcher="inproc"))  # (dynarl sim --fail)
    for changed in ({"survive": False}, {"policy": "dynarl"}, {"oversample": 1.5}, {"staleness": 1},
                    {"workflow": "agentic"}, {"dynamic": True}):
        assert not applies(cfg(**changed)), changed


DYING = {"rollout": ("rollout_worker", DyingRolloutWorker, 1), "reward": ("reward_worker", DyingRewardWorker, 0),
         "inference": ("inference_worker", DyingInferenceWorker, 0),
         "sync": ("rollout_worker", DyingInSyncRolloutWorker, 1)}


def _run_with_a_death(run, component, *extra):
    """3 steps, 2 rollout ranks; a rank of `component` SIGKILLs itself in step 1 holding
    what it took; no restart allowed (run.max_restarts 0)."""
    attribute, cls, _ = DYING[component]
    patch = pytest.MonkeyPatch()
    patch.setattr(GRPO, attribute, cls)
    patch.setenv("DYNARL_TEST_DIE_MARK", os.path.join(run, "died"))
    try:
        job = prepare(None, overrides("runtime.cluster.devices_per_node=4", "placement.mode=spatial",
                                      "rollout.num_ranks=2", "run.steps=3", "run.max_restarts=0",
                                      *extra), run, None)
        rc = job.run()
    finally:
        patch.undo()
    return job, rc


ALWAYS = "inference.old_logprobs=always"  # (an on-policy grpo step has no inference stage else: old_logprobs.py)


@pytest.mark.parametrize("component, extra", [
    ("rollout", ()), ("reward", ()), ("inference", (ALWAYS,)),
    ("inference", (ALWAYS, "trainer.streaming=true")),  # its samples one by one to the trainer, whole per chunk
])
def test_a_killed_rank_is_replaced_and_the_step_goes_on(tmp_path, component, extra):
    _check_survived(tmp_path, component, extra)


def test_a_rank_killed_in_the_weight_sync_is_replaced_and_the_rest_refit(tmp_path):
    """The broadcast breaks; the lost rank is replaced and every rank short of the new
    weights loads them from the trainer (no restart)."""
    _check_survived(tmp_path, "sync", ())


def _check_survived(tmp_path, component, extra):
    run = str(tmp_path / "run")
    job, rc = _run_with_a_death(run, component, *extra)
    assert rc == 0
    assert os.path.exists(os.path.join(run, "died"))
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["survived"] for r in rows] == [0, 1, 0]
    assert rows[1]["reissued_items"] >= (0 if component == "sync" else 1)  # at least the item it died holding
    assert all(r["fleet"]["lost"] == 0 for r in rows)
    # exactly once: every sample of every step in the ledger, none twice
    entries = read_entries(os.path.join(run, "ledger.jsonl"))
    assert [e.step for e in entries] == [0, 1, 2]
    per_step = 8 * 4  # prompts_per_step x samples_per_prompt
    assert all(len(e.sample_ids) == len(set(e.sample_ids)) == per_step for e in entries)
    # the replacement is a new rank on the lost one's device; every process reaped
    group = getattr(job.workflow.g, "rollout" if component == "sync" else component)
    assert DYING[component][2] not in [h.spec.rank for h in group.handles]  # the lost rank's number is gone
    assert sorted(d for h in group.handles for d in h.spec.devices) == sorted(
        job.workflow.placement.rank_devices(group.name) if group.name != "reward" else [0] * len(group.handles))
    assert_reaped([p for g in job.workflow.worker_groups() for p in g.pids])


def test_a_chunk_keeps_its_names_when_a_stopping_consumer_gives_it_back():
    service = ChannelService({})
    rollouts, scored = service.channel("rollouts"), service.channel("scored")
    rollouts.custody = Custody(group_ident)
    scored.releases = rollouts
    producer, b, c = _worker("p"), _worker("b"), _worker("c")
    service.serve_now(producer, "__channel__", ["put_many", "rollouts", [["chunk", None, 2.0, None, [4, 5]]]])
    (row,) = service.serve_now(b, "__channel__", ["get_many", "rollouts", None, 1])
    assert row[3:] == [[4, 5], True] and rollouts.custody.holder == {4: "b", 5: "b"}
    service.serve_now(b, "__channel__", ["give_back", "rollouts", None, [row[:4]]])  # (ChannelClient.give_back)
    assert not rollouts.custody.holder
    service.serve_now(c, "__channel__", ["get_many", "rollouts", None, 1])
    assert rollouts.custody.holder == {4: "c", 5: "c"}
    assert rollouts.reclaim("c") == 1 and len(rollouts) == 1  # one chunk of two groups, back whole


@pytest.mark.parametrize("in_custody, expected", [(True, {"made_of": [3, 7]}), (False, {})])
def test_only_work_from_a_channel_in_custody_is_put_made_of_it(in_custody, expected):
    """(made_of puts go through the controller: without custody they may go peer to peer.)"""
    from dynarl.components.experience import made_of
    chunk = [Group(3), Group(7)]
    assert made_of(SimpleNamespace(in_custody=in_custody), chunk) == expected


def test_the_simulator_loses_a_rank_and_the_run_goes_on():
    """`dynarl sim --fail`: the same workflow survives the loss in place on emulated
    engines (a new engine's start charged), side by side with the run without it."""
    from dynarl.launch.sim.cli import simulate
    from dynarl.launch.sim.scenario import Failure, SimConfig, build_scenario
    failures = (Failure("rollout", 20.0), Failure("reward", 0.0))
    scn = build_scenario(SimConfig(workload="math-1.5b-zero", devices=8, prompts=16, policies=("colocated",),
                                   iterations=2, failures=failures))
    result, _ = simulate(scn)
    fail = result["policies"]["colocated"]["fail"]
    assert result["failures"] == ["rollout@20", "reward@0"]
    assert fail["lost"] == 2 and fail["replaced"] == 2 and fail["same_samples"]
    assert fail["lost_at_s"][1] == 20.0 and fail["cost_s"] > 0  # (reward@0: as soon as the groups are up)
    assert len(fail["iter_time_s"]) == len(fail["clean_iter_time_s"]) == 2


@pytest.mark.parametrize("text, fragment", [
    ("trainer@5", "restarts the job"), ("rollout", "COMPONENT@SECONDS"), ("rollout@-1", ">= 0"),
    ("rollout@soon", "COMPONENT@SECONDS"),
])
def test_sim_failures_are_checked(text, fragment):
    from dynarl.launch.sim.scenario import Failure
    with pytest.raises(ValueError, match=fragment):
        Failure.parse(text)


def test_sim_failures_need_policies_that_survive_in_place():
    from dynarl.launch.sim.scenario import Failure, SimConfig, build_scenario
    with pytest.raises(ValueError, match="policy 'dynarl' moves devices"):
        build_scenario(SimConfig(workload="math-1.5b-zero", devices=8, prompts=16, policies=("colocated", "dynarl"),
                                 failures=(Failure("rollout", 1.0),)))
