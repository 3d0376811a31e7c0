NUM_GPUS = 0

import asyncio
import json

import pytest

from dynarl.components.placement import policy as policies
from dynarl.components.placement.dynarl import Dynarl
from dynarl.components.placement.policy import Colocated
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.core.virtual_time import run_virtual
from dynarl.launch.cli import main as dynarl_main
from dynarl.launch.sim.cli import simulate
from dynarl.launch.sim.report import to_json
from dynarl.launch.sim.runner import run_policy
from dynarl.launch.sim.scenario import SimConfig, build_scenario
from dynarl.transport.errors import ConfigError

SMALL = dict(workload="math-1.5b", devices=16, prompts=8, iterations=2, warmup=1)


def small_result(**kw):
    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("colocated", "spatial", "rlinf-auto"), **kw}))
    return simulate(scn)


def test_same_seed_same_bytes_and_a_new_seed_differs():
    first, _ = small_result()
    assert to_json(first) == to_json(small_result()[0])
    assert to_json(first) != to_json(small_result(seed=1)[0])
    assert set(first["policies"]) == {"colocated", "spatial", "rlinf-auto"}


@pytest.mark.parametrize("kw", [
    pytest.param({}, id="math"),
    pytest.param({"seed": 7, "workload": "math-1.5b-zero"}, id="zero"),
    pytest.param({"workload": "agentic-search-1.5b", "prompts": 6}, id="agentic"),
])
def test_no_policy_beats_the_lower_bound(kw):
    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("colocated", "spatial", "rlinf-auto"), **kw}))
    result, runs = simulate(scn)
    for name, run in runs.items():
        for r in run.iterations:  # every iteration, warm-up included
            assert scn.bounds[r.index].bound_s <= r.end - r.start, (name, r.index)
    for name, m in result["policies"].items():
        assert m["bound_s"] <= m["iter_time_s"], name
        assert 0.0 <= m["gpu_idle_frac"] < 1.0
        assert m["ratio_to_bound"] >= 1.0
        rate = m["tokens_per_s"] if result["kind"] == "math" else m["requests_per_s"]
        assert rate > 0
    assert result["policies"]["colocated"]["speedup_vs_colocated"] == 1.0


def test_colocated_time_shares_every_device_and_spatial_holds_blocks():
    result, runs = small_result()
    owned = {(c, n) for c, n, _, _ in runs["colocated"].ownership}
    assert owned == {("rollout", 16), ("inference", 16), ("trainer", 16)}
    spatial = result["policies"]["spatial"]["placement"]
    assert spatial["mode"] == "spatial" and sum(spatial["devices"].values()) == 16
    for name in ("colocated", "spatial"):
        assert result["policies"][name]["decisions"] == 0
        assert result["policies"][name]["decision_ms_p99"] == 0.0
    assert result["policies"]["rlinf-auto"]["decisions"] == 2  # once per iteration end


class Watcher(Colocated):
    """A policy with an iteration-end hook that only looks: the extension point rlinf-auto uses."""
    name = "test-watcher"
    has_hook = True
    seen: list = []

    def decide(self, snapshot):
        Watcher.seen.append(snapshot)
        return []


class ColocatedDynarl(Dynarl):
    """dynarl's scheduler on time-shared devices."""
    name = "test-colocated-dynarl"

    def place(self, ctx):
        return Colocated().place(ctx)


@pytest.fixture
def test_policies():
    policies.register("test-watcher", Watcher)
    policies.register("test-colocated-dynarl", ColocatedDynarl)
    yield
    for name in ("test-watcher", "test-colocated-dynarl"):
        policies.REGISTRY.pop(name)


def test_an_iteration_end_hook_sees_each_iterations_stage_times(test_policies):
    Watcher.seen = []
    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("test-watcher",)}))
    run = run_policy(scn, "test-watcher")
    assert [s.iteration for s in Watcher.seen] == [0, 1] and len(run.decision_ms) == 2
    assert all(s.at_iteration_end and set(s.stage_s) == {"rollout", "inference", "trainer"}
               for s in Watcher.seen)


def test_the_scheduler_reads_every_engine_from_the_hypergraph_during_iterations(monkeypatch):
    """dynarl's scheduler decides on views of the running step (the decision replaced by
    one that only looks): every rollout engine's low-since, the requests, the devices."""
    from dynarl.core.scheduler import loop
    views = []

    def watch(view, predictor, config):
        views.append(view)
        return None
    monkeypatch.setattr(loop, "decide_dynarl", watch)
    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("dynarl",)}))
    run = run_policy(scn, "dynarl")
    assert len(views) >= 4 and len(run.decision_ms) == len(views)
    rollout = [v.components[0] for v in views]
    generating = [r for r in rollout if r.active_requests]  # (lent engines go home at the rollout's end)
    assert len(generating) >= 4 and all(r.name == "rollout" and len(r.engine_low_since) == r.devices
                                        for r in generating)
    assert rollout[0].devices == 16  # the rollout holds every device at the start (lending)
    assert any(r.active_requests for r in rollout) and any(r.remaining_work > 0 for r in rollout)
    assert {c.name for v in views for c in v.components} == {"rollout", "inference", "trainer"}


def test_online_migrations_need_devices_of_their_own(test_policies):
    """dynarl moves devices between spatial segments; time-shared devices have none to move."""
    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("test-colocated-dynarl",)}))
    with pytest.raises(ConfigError, match="rollout on devices of its own"):
        run_policy(scn, "test-colocated-dynarl")


def test_cli_rejects_unknown_policies_and_reports_trace_rejects(tmp_path, capsys):
    assert dynarl_main(["sim", "--policies", "colocated,fastest"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([json.dumps({"prompt_id": f"p{i // 4}", "response_tokens": 50 + 40 * i})
                                for i in range(16)] + ["oops", json.dumps({"prompt_id": "x"})]) + "\n")
    rc = dynarl_main(["sim", "--workload", "math-1.5b-zero", "--devices", "8", "--policies", "spatial",
                      "--trace", str(trace), "--json"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "line 17: not JSON" in captured.err and "line 18:" in captured.err
    out = json.loads(captured.out)
    assert out["trace"] == {"file": str(trace), "groups": 4, "requests": 16, "rejected": 2,
                            "rejected_lines": [17, 18]}
    assert set(out["policies"]) == {"colocated", "spatial"}  # the baseline always runs


def test_cli_runs_several_device_counts_in_one_command(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps({"prompt_id": f"p{i // 4}", "response_tokens": 50 + 40 * i})
                               for i in range(16)) + "\n")
    rc = dynarl_main(["sim", "--workload", "math-1.5b-zero", "--devices", "8,16", "--policies", "spatial",
                      "--trace", str(trace), "--json"])
    assert rc == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["devices"] for r in runs] == [8, 16]
    assert all(set(r["policies"]) == {"colocated", "spatial"} for r in runs)


@pytest.mark.parametrize("text,ok", [("64", [64]), ("64,128", [64, 128]), (" 8 , 16 ", [8, 16]),
                                     ("0", None), ("64,x", None), ("", None), (",", None)])
def test_device_counts(text, ok):
    import argparse
    from dynarl.launch.sim.cli import device_counts
    if ok is None:
        with pytest.raises(argparse.ArgumentTypeError):
            device_counts(text)
    else:
        assert device_counts(text) == ok


def test_lazy_outputs_change_nothing_but_when_ids_are_built():
    reqs = [GenerationRequest(f"r{i}", list(range(1, 40 + i)), SamplingParams(max_new_tokens=30 + 7 * i))
            for i in range(6)]

    async def go(lazy):
        eng = EmulatedRolloutEngine(EmulatedRolloutConfig(model="qwen2.5-1.5b", lazy_outputs=lazy))
        results = await eng.generate(reqs)
        return results, asyncio.get_running_loop().time()

    eager, t_eager = run_virtual(go(False))
    lazy, t_lazy = run_virtual(go(True))
    assert t_eager == t_lazy
    for a, b in zip(eager, lazy):
        assert len(b.output_token_ids) == len(a.output_token_ids)
        assert list(b.output_token_ids) == a.output_token_ids
        assert list(b.output_logprobs) == a.output_logprobs


def test_plots_are_written(tmp_path):
    from dynarl.launch.sim.plot import busy_steps, ownership_steps, write_policies, write_timeline

    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("colocated", "spatial")}))
    result, runs = simulate(scn)
    paths = [write_timeline(name, run, scn, str(tmp_path)) for name, run in runs.items()]
    paths.append(write_policies(result, str(tmp_path)))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["policies.png", "timeline-colocated.png",
                                                          "timeline-spatial.png"]
    assert all((tmp_path / p.rsplit("/", 1)[1]).stat().st_size > 1000 for p in paths)
    times, counts = busy_steps([(0.0, 2.0, 3), (1.0, 3.0, 2)])
    assert (times, counts) == ([0.0, 1.0, 2.0, 3.0], [3, 5, 2, 0])
    points, stacks = ownership_steps([("rollout", 4, 0.0, 1.0), ("trainer", 4, 1.0, 2.0)])
    assert points == [0.0, 1.0, 2.0] and stacks["rollout"] == [4, 0, 0] and stacks["trainer"] == [0, 4, 0]


def test_the_async_policy_overlaps_each_step_with_the_next_rollout():
    """`async` runs `dynarl train`'s overlapped steps (algorithm.max_staleness 1) on the
    spatial split: its measured step trains samples one version old, and it needs a
    step that is neither the first nor the last to measure."""
    scn = build_scenario(SimConfig(**{**SMALL, "iterations": 3, "policies": ("colocated", "spatial", "async")}))
    result, runs = simulate(scn)
    spatial, overlapped = result["policies"]["spatial"], result["policies"]["async"]
    assert spatial["placement"] == overlapped["placement"]
    assert spatial["staleness_max"] == 0 and overlapped["staleness_max"] == 1
    assert runs["async"].staleness == [0, 1, 1] and runs["spatial"].staleness == [0, 0, 0]
    with pytest.raises(ValueError, match="--iterations >= warmup \\+ 1 \\+ max_staleness \\(3\\)"):
        run_policy(build_scenario(SimConfig(**{**SMALL, "policies": ("async",)})), "async")


def test_max_staleness_bounds_every_asynchronous_policy_alike():
    """--max-staleness 2: async runs two steps ahead, the partial policies carry groups up
    to two versions and start none again; the on-policy ones are untouched; the measured
    window leaves out the last two steps for all."""
    scn = build_scenario(SimConfig(**{**SMALL, "iterations": 4, "max_staleness": 2,
                                      "policies": ("colocated", "async", "partial", "dynarl-async")}))
    result, runs = simulate(scn)
    assert runs["async"].staleness == [0, 1, 2, 2] and result["measured_iterations"] == 1
    for name in ("partial", "dynarl-async"):
        assert max(runs[name].staleness) <= 2 and result["policies"][name]["regenerated_groups"] == 0
    assert runs["colocated"].staleness == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="--max-staleness bounds the asynchronous policies"):
        SimConfig(**{**SMALL, "max_staleness": 0})


@pytest.mark.parametrize("name, k, expected", [
    ("colocated", 3, 0), ("dynarl", 3, 0), ("async", None, 1), ("async", 3, 3),
    ("partial", None, 1 << 20), ("partial", 2, 2), ("dynarl-async", None, 1), ("dynarl-async", 2, 2),
])
def test_staleness_of(name, k, expected):
    from dynarl.launch.sim.scenario import staleness_of
    assert staleness_of(policies.make_policy(name), SimConfig(**{**SMALL, "max_staleness": k})) == expected


def test_the_partial_policies_carry_groups_and_draw_prompts_past_the_runs_batches():
    """`partial` (no staleness bound) and `dynarl-async` (bound 1) run `dynarl train`'s
    partial rollout: more groups generate than a step trains, the extra prompts come from
    batches after the run's own, and the unfinished ones are carried (the backlog)."""
    scn = build_scenario(SimConfig(**{**SMALL, "iterations": 3, "policies": ("colocated", "partial", "dynarl-async")}))
    result, runs = simulate(scn)
    for name, bound in (("partial", 1 << 20), ("dynarl-async", 1)):
        m = result["policies"][name]
        assert 0 <= m["staleness_max"] <= bound
        assert sum(int(k) * v for k, v in m["staleness_hist"].items()) > 0  # some trained samples were carried
        assert m["carried_tokens"][1] > 0  # a backlog at the end of the measured iterations
        assert [i.samples for i in runs[name].iterations] == [8 * len(scn.batches[0][0].samples)] * 3
    assert result["policies"]["colocated"]["staleness_hist"] == {"0": 2 * 8 * len(scn.batches[0][0].samples)}


def test_ppo_adds_its_critic_to_the_bound_and_to_the_devices_work():
    """ppo-1.5b is math-1.5b's batch with a critic of the policy's size: the same requests,
    a longer iteration (the critic's values before the policy's step, its own step
    beside it), its device time in the busy time, no policy under the bound (which
    counts the critic too); hybrid places rollout apart from inference + trainer."""
    policies = ("colocated", "hybrid")  # (16 prompts: a trainer stepping on the whole batch needs a group per rank)
    grpo, grpo_runs = simulate(build_scenario(SimConfig(**{**SMALL, "prompts": 16, "policies": policies})))
    scn = build_scenario(SimConfig(**{**SMALL, "prompts": 16, "workload": "ppo-1.5b", "policies": policies}))
    ppo, ppo_runs = simulate(scn)
    for name in policies:
        assert ppo["policies"][name]["iter_time_s"] > grpo["policies"][name]["iter_time_s"]
        assert ppo["policies"][name]["bound_s"] > grpo["policies"][name]["bound_s"]
        assert ppo["policies"][name]["bound_s"] <= ppo["policies"][name]["iter_time_s"]
        assert ppo_runs[name].iterations[-1].stage_s["critic"] > 0
        assert "critic" not in grpo_runs[name].iterations[-1].stage_s
    assert ppo_runs["hybrid"].placements[0][1].describe().startswith("rollout:")
    assert "inference+trainer" in ppo_runs["hybrid"].placements[0][1].describe()


def test_ppo_under_dynarl_trains_on_every_device_at_the_barrier():
    """The trainer steps on the whole batch (GAE): before the barrier it takes only the
    devices of engines that hold no request, and at the barrier the finished stages (the
    rollout's last engine, inference's rank) lend it theirs, so it (its critic following)
    trains on all 16; they take them back at the step's end."""
    scn = build_scenario(SimConfig(**{**SMALL, "prompts": 16, "workload": "ppo-1.5b",
                                      "policies": ("colocated", "dynarl")}))
    _, runs = simulate(scn)
    run = runs["dynarl"]
    home = run.placements[0][1]
    assert home.num_devices_of("trainer") == 1
    whole = [(start, end) for name, n, start, end in run.ownership if name == "trainer" and n == 16]
    assert len(whole) == 2  # each iteration's train step
    for start, end in whole:  # nobody else holds a device meanwhile
        assert not [o for o in run.ownership if o[0] != "trainer" and o[2] < end and o[3] > start and o[1] > 0]
        after = [n for name, n, s, _ in run.ownership if name == "trainer" and s >= end]
        assert after[0] == 1  # home again before the weight sync
    assert len(run.migrations["switch"]) >= 4  # per iteration: lending's return, rollout and inference lent
