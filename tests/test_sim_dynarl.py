NUM_GPUS = 0

import dataclasses

import pytest

from dynarl.components.placement.dynarl import DynarlConsolidate, DynarlCostAware
from dynarl.core.scheduler.policy import ComponentView, DynarlConfig, is_donor, track_low
from dynarl.core.scheduler.view import (RolloutProgress, downstream_tokens_left, packable_since, rollout_demand,
                                        rollout_tokens_left, tokens_left)
from dynarl.launch.sim.cli import simulate
from dynarl.launch.sim.report import to_json
from dynarl.launch.sim.runner import run_policy
from dynarl.launch.sim.scenario import SimConfig, build_scenario, output_cap
from dynarl.launch.sim.sweep import sweep

SMALL = dict(workload="math-1.5b", devices=16, prompts=64, iterations=2, warmup=1)


@pytest.fixture(scope="module")
def small():
    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("colocated", "dynarl", "dynarl-costaware",
                                                           "dynarl-consolidate")}))
    return scn, simulate(scn)


def test_dynarl_migrates_finishes_and_stays_above_the_bound(small):
    scn, (result, runs) = small
    m = result["policies"]["dynarl"]
    assert m["migrations"]["workload"]["count"] >= 1 and m["migrations"]["p2p"]["count"] >= 1
    assert m["migrations"]["workload"]["cost_s"] > 0 and m["migrations"]["p2p"]["cost_s"] > 0
    assert m["decisions"] > 10 and m["decision_ms_p99"] is None  # wall clock only with --timings
    for name, p in result["policies"].items():
        assert p["bound_s"] <= p["iter_time_s"], name
    run = runs["dynarl"]
    assert len(run.iterations) == 2
    # every generated token of the batch was made once: no request lost or run twice
    for rec in run.iterations:
        assert rec.tokens == sum(s.generated_tokens for g in scn.batches[rec.index] for s in g.samples)


def test_ownership_timeline_shows_each_move(small):
    scn, (_, runs) = small
    own = runs["dynarl"].ownership
    rollout = {n for c, n, _, _ in own if c == "rollout"}
    trainer = {n for c, n, _, _ in own if c == "trainer"}
    assert len(rollout) > 1 and len(trainer) > 1  # devices left rollout and joined the trainer
    # at no moment do the components hold more devices than exist
    for t in sorted({s for _, _, s, _ in own}):
        assert sum(n for _, n, s, e in own if s <= t < e) <= scn.config.devices


def test_dynarl_json_is_deterministic(small):
    scn, (first, _) = small
    again, _ = simulate(build_scenario(scn.config))
    assert to_json(first) == to_json(again)


def test_variants_run_on_the_same_batches(small):
    _, (result, _) = small
    for name in ("dynarl-costaware", "dynarl-consolidate"):
        p = result["policies"][name]
        assert p["iter_time_s"] > 0 and p["decisions"] > 0


def test_donor_needs_low_utilization_past_the_peak_for_the_window():
    """The paper's signal on a sequence of polls: the KV filling at the start is below
    U_low, but at its peak (filling): no donor; once every engine drains below U_low and
    its peak, the rollout donates after T = 4 s."""
    config, engines = DynarlConfig(), ["e0", "e1", "e2", "e3"]
    since, peak = {}, {}
    donor_at = []
    for now, u in ((0.0, 0.02), (5.0, 0.03), (10.0, 0.001), (13.0, 0.001), (14.5, 0.001)):
        since, peak, _ = track_low(engines, [u] * 4, now, since, peak, config.u_low)
        view = ComponentView("rollout", "dynamic", 8, 1e6, devices_per_engine=2,
                             engine_low_since=tuple(since[e] for e in engines))
        if is_donor(view, now, config):
            donor_at.append(now)
    assert donor_at == [14.5]


def test_consolidate_keeps_fewer_engines_than_dynarl():
    p = RolloutProgress(active=40, kv_tokens=200_000, capacity=100_000)
    peaks = {f"e{i}": 0.6 for i in range(4)}
    assert rollout_demand(p, peaks, pack=2.0) < rollout_demand(p, peaks, pack=1.0) == 4
    # 60k tokens fit one engine at the 0.6 peak fill; no active request needs none
    assert rollout_demand(RolloutProgress(active=40, kv_tokens=60_000, capacity=100_000), peaks) == 1
    assert rollout_demand(RolloutProgress(), peaks) == 0


def test_the_variants_are_settings_of_the_one_scheduler():
    assert DynarlCostAware().config.charge_move_cost and not DynarlConsolidate().config.charge_move_cost
    assert (DynarlConsolidate().config.pack, DynarlConsolidate().config.donor) == (2.0, "packable")
    settings = DynarlConsolidate().scheduler(engines=512)
    assert settings["interval_s"] == settings["tail_interval_s"] == 2.0 and settings["lend"]


@pytest.mark.parametrize("engines, demand, since, packable", [
    pytest.param(10, 1, None, 4.5, id="stragglers-fit-on-one-engine-of-ten"),
    pytest.param(10, 1, 2.0, 2.0, id="since-first-seen"),
    pytest.param(10, 3, 2.0, None, id="more-than-one-fifth-resets"),
    pytest.param(1, 0, None, None, id="one-engine-has-nothing-to-pack"),
])
def test_consolidate_donates_when_the_stragglers_fit_on_few_engines(engines, demand, since, packable):
    assert packable_since(engines, demand, 0.8, 4.5, since) == packable


def test_sweep_varies_one_parameter_at_a_time():
    out = sweep(devices=8, seed=0, iterations=2, warmup=1, prompts=4)
    assert [r["u_low"] for r in out["rows"]["u_low"]] == [0.01, 0.1, 0.2, 0.3, 0.5]
    assert [r["window_s"] for r in out["rows"]["window_s"]] == [2.0, 4.0, 8.0, 32.0, 64.0]
    assert max(r["vs_best"] for r in out["rows"]["u_low"]) == 1.0


def test_dynarl_runs_agentic_episodes():
    # agentic episodes migrate too (components/workflows/episodes.py; tests/test_sim_agentic.py)
    scn = build_scenario(SimConfig(workload="agentic-search-1.5b", devices=16, prompts=16, iterations=2, warmup=1))
    run = run_policy(scn, "dynarl")
    assert len(run.iterations) == 2 and run.decision_ms


@pytest.mark.parametrize("made,finished_mean,cap,expected", [
    pytest.param(1000, 0.0, None, 1000.0, id="as-many-again-without-a-cap"),
    pytest.param(1000, 3000.0, None, 3000.0, id="at-least-the-finished-mean"),
    pytest.param(6000, 0.0, 8000, 2000.0, id="never-past-the-cap"),
    pytest.param(6000, 3000.0, 8000, 2000.0, id="the-cap-overrides-the-finished-mean"),
    pytest.param(8000, 0.0, 8000, 0.0, id="at-the-cap-nothing-left"),
])
def test_tokens_left_per_request(made, finished_mean, cap, expected):
    assert tokens_left(made, finished_mean, cap) == pytest.approx(expected)


def test_rollout_tokens_left_reads_the_engines_progress():
    p = RolloutProgress(active=4, generated=4 * 6000, finished=2, finished_tokens=6000)
    assert rollout_tokens_left(p, cap=8000) == pytest.approx(4 * 2000.0)
    assert rollout_tokens_left(RolloutProgress(), cap=8000) == 0.0


# 10 samples of prompt 100: 4 finished (2,000 output tokens), 4 running (500 made each), 2 unstarted.
DOWN = dict(samples=10, prompt_mean=100.0, finished=4, finished_tokens=2000.0, active=4, made=500.0,
            finished_mean=500.0, cap=None)


@pytest.mark.parametrize("changes,expected", [
    pytest.param({"processed": 0.0}, 2400 + 4 * 1100 + 2 * 600, id="nothing-processed"),
    pytest.param({"processed": 2400.0}, 4 * 1100 + 2 * 600, id="the-finished-are-processed"),
    pytest.param({"processed": 9999.0}, 4 * 1100 + 2 * 600, id="never-negative-for-what-is-done"),
    pytest.param({"processed": 0.0, "cap": 700}, 2400 + 4 * 800 + 2 * 600, id="running-capped-by-max-tokens"),
    pytest.param({"processed": 0.0, "finished": 0, "finished_tokens": 0.0, "finished_mean": 0.0},
                 4 * 1100 + 6 * 600, id="nothing-finished-yet"),
])
def test_downstream_tokens_left(changes, expected):
    assert downstream_tokens_left(**{**DOWN, **changes}) == pytest.approx(expected)


def test_output_cap_only_for_a_capped_math_workload_without_a_trace():
    scn = build_scenario(SimConfig(**SMALL))
    assert output_cap(scn) == int(scn.workload.response_tokens.cap)
    assert output_cap(dataclasses.replace(scn, trace=object())) is None
