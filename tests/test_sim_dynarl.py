NUM_GPUS = 0

import dataclasses

import pytest

from dynarl.components.placement.dynarl import Dynarl, DynarlConsolidate, rollout_tokens_left, tokens_left
from dynarl.components.placement.policy import Migrate, PlanContext, Snapshot
from dynarl.core.scheduler.policy import DynarlConfig
from dynarl.launch.sim.cli import simulate
from dynarl.launch.sim.report import to_json
from dynarl.launch.sim.runner import run_policy
from dynarl.launch.sim.scenario import SimConfig, build_scenario
from dynarl.launch.sim.snapshot import downstream_tokens_left, output_cap
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


def snap(now, util, **kw):
    base = dict(iteration=0, now_s=now, at_iteration_end=False, placement=None,
                rollout_utilization=tuple(util), rollout_engines=tuple(f"e{i}" for i in range(len(util))),
                devices={"rollout": 2 * len(util), "inference": 1, "trainer": 3},
                rollout_active=len(util), rollout_generated=1000 * len(util), rollout_kv_tokens=0,
                rollout_capacity=100_000, remaining_tokens={"inference": 1e6, "trainer": 1e7},
                rate_points={"rollout": ((2, 100.0), (8, 400.0)), "inference": ((1, 3e4), (64, 64 * 3e4)),
                             "trainer": ((1, 1e4), (64, 64 * 1e4))},
                interruptible={"rollout": True}, accepting={"inference": True, "trainer": True},
                migration_cost_s={"workload": 1.0, "p2p": 2.3})
    return Snapshot(**{**base, **kw})


def policy(cls=Dynarl, **cfg):
    p = cls(DynarlConfig(**cfg)) if cfg else cls()
    p.place(PlanContext(num_devices=12, granularity={"rollout": 2}, work={}, switch_s=2.0, micro_batches=8,
                        min_devices={"trainer": 3}))
    return p


def test_donor_needs_low_utilization_past_the_peak_for_the_window():
    p = policy()
    # the KV filling at the start is below U_low, but at its peak (filling): no donor
    assert p.decide(snap(0.0, [0.02] * 4)) == []
    assert p.decide(snap(5.0, [0.03] * 4)) == []
    # then every engine drains below U_low and its peak; only after T = 4 s does it donate
    assert p.decide(snap(10.0, [0.001] * 4)) == []
    moves = p.decide(snap(14.5, [0.001] * 4, rollout_active=1))
    assert moves and all(isinstance(m, Migrate) and m.source == "rollout" for m in moves)
    assert {m.kind for m in moves} <= {"p2p", "workload"}
    assert sum(m.devices for m in moves) % 2 == 0  # whole engines


def test_consolidate_keeps_fewer_engines_than_dynarl():
    kw = dict(rollout_active=40, rollout_kv_tokens=200_000)
    a, b = policy(), policy(DynarlConsolidate)
    for p in (a, b):
        p.decide(snap(0.0, [0.6] * 4))
    assert b.rollout_demand(snap(1.0, [0.3] * 4, **kw)) < a.rollout_demand(snap(1.0, [0.3] * 4, **kw))


def test_costaware_refuses_a_gain_below_the_migration_cost():
    from dynarl.components.placement.dynarl import DynarlCostAware
    from dynarl.core.scheduler.policy import Plan
    p = policy(DynarlCostAware)
    s = snap(0.0, [0.0] * 4)
    assert not p.commit(Plan({}, (("rollout", "trainer", 2),), 99.0, 100.0, 3), s)
    assert p.commit(Plan({}, (("rollout", "trainer", 2),), 50.0, 100.0, 3), s)


def test_sweep_varies_one_parameter_at_a_time():
    out = sweep(devices=8, seed=0, iterations=2, warmup=1, prompts=4)
    assert [r["u_low"] for r in out["rows"]["u_low"]] == [0.01, 0.1, 0.2, 0.3, 0.5]
    assert [r["window_s"] for r in out["rows"]["window_s"]] == [2.0, 4.0, 8.0, 32.0, 64.0]
    assert max(r["vs_best"] for r in out["rows"]["u_low"]) == 1.0


def test_consolidate_donates_when_stragglers_fit_on_few_engines_and_dynarl_waits():
    # 10 engines, each still at its peak fill (stragglers on every engine), but their
    # KV together would fit on 1 engine at twice that fill
    util = [0.5] * 10
    kw = dict(rollout_active=10, rollout_kv_tokens=60_000, rollout_capacity=100_000,
              devices={"rollout": 20, "inference": 1, "trainer": 3})
    base, cons = policy(), policy(DynarlConsolidate)
    for t in (0.0, 2.0, 4.5):
        a, b = base.decide(snap(t, util, **kw)), cons.decide(snap(t, util, **kw))
    assert a == [] and b and all(m.source == "rollout" for m in b)
    assert cons.decide(snap(0.0, util, iteration=1, **kw)) == []  # the window restarts each iteration


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


def test_rollout_tokens_left_reads_the_snapshot():
    s = snap(1.0, [0.3] * 4, rollout_active=4, rollout_generated=4 * 6000, rollout_finished_mean=3000.0,
             rollout_max_new_tokens=8000)
    assert rollout_tokens_left(s) == pytest.approx(2000.0)
    assert rollout_tokens_left(snap(1.0, [0.0] * 4, rollout_active=0, rollout_generated=0)) == 0.0


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


def test_rollout_view_keeps_its_kv_demand_but_prices_density_by_requests():
    """The donor keeps the engines its KV needs at the peak fill (keep_engines), while the
    predictor's cap is the running requests, not those engines: its rate points already
    price a denser batch, so capping at the KV demand would call every engine above it useless."""
    p = policy()
    p.decide(snap(0.0, [0.6] * 4))
    s = snap(1.0, [0.3] * 4, rollout_active=40, rollout_kv_tokens=60_000)
    view = p.views(s)[0]
    assert view.active_requests == 40 and view.requests_per_engine == 1
    assert view.keep_engines == p.rollout_demand(s) == 1  # 60k tokens fit one engine at the 0.6 peak fill
