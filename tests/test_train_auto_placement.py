NUM_GPUS = 0
"""`dynarl train placement.mode=auto`: before training each component is timed on the
job's own engines and rlinf-auto's planner (the `dynarl sim` policy's) places them;
the run then trains on that placement as on a configured one."""

import json
import os

import pytest

from dynarl.components.placement.profile import StageProfile
from dynarl.components.workflows.auto_placement import plan_placement, profile_counts, share
from dynarl.components.workflows.config import load_config
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import dry_run_report, prepare
from dynarl.transport.errors import ConfigError
from grpo_tiny import overrides


@pytest.mark.parametrize("devices, counts", [(1, [1]), (3, [1, 2, 3]), (4, [1, 2, 4]), (6, [1, 2, 4, 6])])
def test_profile_counts(devices, counts):
    assert profile_counts(devices) == counts


@pytest.mark.parametrize("groups, engines, expected", [(8, 1, 8), (8, 3, 3), (8, 8, 1), (2, 4, 1)])
def test_share(groups, engines, expected):
    assert len(share(list(range(groups)), engines)) == expected


def linear(t1):
    return StageProfile(((1, t1),))


@pytest.mark.parametrize("profiles, switch_s, mode", [
    # cheap role switches and stages that scale: every stage on every device, one after another
    ({"rollout": linear(8.0), "inference": linear(1.0), "trainer": linear(3.0)}, 0.0, "colocated"),
    # a rollout that stops scaling past one device and costly switches: its own device, pipelined
    ({"rollout": StageProfile(((1, 8.0), (4, 7.9))), "inference": linear(1.0), "trainer": linear(8.0)}, 5.0,
     "spatial"),
])
def test_plan_placement_is_rlinf_autos(profiles, switch_s, mode):
    placement = plan_placement(profiles, 4, switch_s, micro_batches=4)
    assert placement.mode == mode and placement.num_devices == 4


@pytest.mark.parametrize("extra, field", [
    (("placement.mode=auto", "scheduler.policy=dynarl", "runtime.cluster.devices_per_node=4"), "placement.mode"),
    (("placement.mode=auto", "workflow=agentic"), "placement.mode"),
    (("placement.mode=auto", "run.prompts_per_step=2"), "run.prompts_per_step"),
    (("placement.mode=auto", "placement.pools=[[rollout], [inference, trainer]]"), "placement.pools"),
])
def test_auto_config_errors(extra, field):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides(*extra))
    assert err.value.path == field


def test_dry_run_says_when_the_placement_is_chosen():
    report = dry_run_report(None, overrides("placement.mode=auto"), None, None)
    assert "placement auto: planned at start from a profile of each component" in report


def test_an_auto_run_profiles_plans_and_trains_on_the_plan(tmp_path):
    run_dir = str(tmp_path / "auto")
    job = prepare(None, overrides("placement.mode=auto", "runtime.cluster.devices_per_node=2", "run.steps=1",
                                  "trainer.warmup.steps=1"), run_dir, None)
    assert job.run() == 0
    report = json.load(open(os.path.join(run_dir, "placement.json")))
    assert [n for n, _ in report["profiles"]["rollout"]] == [1, 2]  # the cluster: 2 devices
    assert all(t > 0 for _, t in report["profiles"]["rollout"]) and report["switch_s"] > 0
    assert all(len(report["profiles"][c]) == 1 for c in ("inference", "trainer"))
    devices = report["devices"]
    assert set().union(*map(set, devices.values())) == {0, 1} and all(devices.values())
    # the job's groups ran where the plan put them (the saved hypergraph's nodes)
    graph = {n["name"]: n for n in json.load(open(os.path.join(run_dir, "graph.json")))["nodes"]}
    for component, placed in devices.items():
        if component == "inference" and job.workflow.inference_pass is None:
            assert component not in graph  # planned, but no step runs it: not spawned (old_logprobs.py)
            continue
        assert sorted(graph[component]["devices"]) == sorted(placed), component
    assert "rollout~profile" not in graph or not graph["rollout~profile"]["workers"]  # the profile's ranks stopped
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == [0]
    assert all(len(e.sample_ids) == len(set(e.sample_ids)) == 8 * 4 for e in entries)


def test_a_failed_profile_stops_its_ranks(tmp_path, monkeypatch):
    """The profile's ranks go whatever happens to it: a step that fails half-way
    (here inference's timing) ends the run with its error and leaves no process."""
    from dynarl.components.workflows import auto_placement
    from test_dynarl_train import _children

    async def fail(*args, **kwargs):
        raise RuntimeError("injected: inference's profile failed")
    monkeypatch.setattr(auto_placement, "_timed_logprobs", fail)
    before = _children()
    job = prepare(None, overrides("placement.mode=auto", "runtime.cluster.devices_per_node=2", "run.steps=1"),
                  str(tmp_path / "failed"), None)
    with pytest.raises(RuntimeError, match="injected"):
        job.run()
    assert _children() <= before, "profile ranks left behind"
