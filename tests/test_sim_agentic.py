NUM_GPUS = 0
"""Agentic workloads in `dynarl sim`: the engines' queue order and the turn routing come
from the policy (components/placement/agentic.py); follow-up turns are routed by core's
DataRouter (the agentic workflow's EpisodeDriver, components/workflows/episodes.py);
episodes take part in Workload migration."""

import pytest

from dynarl.components.placement.agentic import BASELINE, DYNARL, AgenticMode, agentic_mode
from dynarl.components.placement.policy import make_policy
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.launch.sim.cli import simulate
from dynarl.launch.sim.report import to_json
from dynarl.launch.sim.runner import run_policy
from dynarl.launch.sim.scenario import SimConfig, build_scenario, for_policy

TINY = dict(workload="agentic-search-1.5b", devices=8, prompts=8, iterations=2, warmup=1)


@pytest.mark.parametrize("name,mode", [
    ("colocated", BASELINE), ("spatial", BASELINE), ("rlinf-auto", BASELINE),
    ("dynarl", DYNARL), ("dynarl-costaware", DYNARL), ("dynarl-noprio", BASELINE)])
def test_each_policy_has_its_request_handling(name, mode):
    assert agentic_mode(make_policy(name)) == mode


def test_the_mode_reaches_the_rollout_engines_of_agentic_runs_only():
    scn = build_scenario(SimConfig(**TINY))
    rollout = for_policy(scn, make_policy("dynarl")).engines["rollout"]
    assert (rollout["queue"], rollout["affinity"]) == ("priority", "prefer")
    assert "queue" not in scn.engines["rollout"]  # the shared scenario is left alone
    math = build_scenario(SimConfig(workload="math-1.5b", devices=8, prompts=2))
    assert "queue" not in for_policy(math, make_policy("dynarl")).engines["rollout"]
    # whether moved requests take their KV (dynarl-kv) reaches every workload's engines
    assert [for_policy(w, make_policy(p)).engines["rollout"]["move_kv"]
            for w in (scn, math) for p in ("dynarl", "dynarl-kv")] == [False, True, False, True]
    with pytest.raises(ValueError, match="affinity"):
        AgenticMode(queue="fifo", affinity="sometimes")


def test_priority_and_affinity_reprefill_fewer_tokens_and_every_episode_ends_once():
    scn = build_scenario(SimConfig(**TINY, policies=("colocated", "dynarl-noprio", "dynarl")))
    result, runs = simulate(scn)
    episodes = sum(len(g.samples) for g in scn.batches[1])
    for name, run in runs.items():
        # the runner's exactly-once check passed for every iteration (it raises otherwise)
        assert [r.samples for r in run.iterations] == [sum(len(g.samples) for g in b) for b in scn.batches]
    m = result["policies"]
    assert m["dynarl"]["reprefill_tokens"] < m["dynarl-noprio"]["reprefill_tokens"]
    assert m["dynarl"]["reprefill_tokens"] < m["colocated"]["reprefill_tokens"]
    assert m["dynarl-noprio"]["reprefill_tokens"] > 0  # no affinity: turns land on other engines
    assert all(p["requests_per_s"] > 0 for p in m.values()) and episodes == 40
    assert to_json(result) == to_json(simulate(scn)[0])  # routing is deterministic


def move_once():
    """A decision function for the scheduler (in place of decide_dynarl): one forced move,
    2 s into the run: every rollout engine but one goes to the trainer, busy ones
    included."""
    from dynarl.core.scheduler.policy import Plan
    state = {"first": None, "moved": False}

    def decide(view, predictor, config):
        rollout = view.components[0]
        state["first"] = view.now if state["first"] is None else state["first"]
        if state["moved"] or view.now - state["first"] < 2.0 or not rollout.interruptible or rollout.devices <= 1:
            return None
        state["moved"] = True
        return Plan({}, (("rollout", "trainer", rollout.devices - rollout.devices_per_engine),), 0.0, 1.0, 1)
    return decide


def test_episodes_migrate_between_and_inside_turns_and_affinity_falls_back(monkeypatch):
    # rStar-like episodes (0.2 s tools): at the move some are decoding a turn (exported with
    # their tokens so far), some wait on their tool (exported with what is left of it)
    scn = build_scenario(SimConfig(workload="agentic-rstar-1.5b", devices=8, prompts=4, iterations=2, warmup=1))
    stay = run_policy(scn, "dynarl")
    from dynarl.core.scheduler import loop
    monkeypatch.setattr(loop, "decide_dynarl", move_once())
    moved = run_policy(scn, "dynarl")
    # dynarl alone does not move this small run: each follow-up turn goes home and
    # recomputes at most the last, partial prefix-cache block of its context
    block = EmulatedRolloutConfig(**scn.engines["rollout"]).block_size
    for it, tokens in enumerate(stay.reprefill_tokens):
        follow_ups = sum(len(s.turns) - 1 for g in scn.batches[it] for s in g.samples)
        assert 0 < tokens < block * follow_ups
    assert moved.migrations["p2p"]
    assert len(moved.iterations) == 2  # every episode reached the trainer exactly once (checked per iteration)
    # the released engines' episodes continue on the kept one (fallback: home gone), which
    # prefills their contexts again; the next iteration starts on the full placement
    assert moved.reprefill_tokens[0] > 5 * stay.reprefill_tokens[0]
    assert moved.reprefill_tokens[1] == stay.reprefill_tokens[1]


def test_async_overlaps_agentic_steps():
    """`async` plays the next iteration's episodes whole on the current weights while this
    iteration's are trained (staleness 1 after the first)."""
    scn = build_scenario(SimConfig(**{**TINY, "iterations": 3, "policies": ("colocated", "spatial", "async")}))
    result, runs = simulate(scn)
    assert runs["async"].staleness == [0, 1, 1] and runs["spatial"].staleness == [0, 0, 0]
    assert result["policies"]["async"]["placement"] == result["policies"]["spatial"]["placement"]
    for run in runs.values():  # every episode of every iteration trained once (the runner checks it)
        assert [r.samples for r in run.iterations] == [sum(len(g.samples) for g in b) for b in scn.batches]


def test_partial_rollout_carries_agentic_episodes_mid_way():
    """`partial` and `dynarl-async` close each iteration on its N-th group: the episodes not
    over wait for the next (their tokens carried), every iteration trains N groups, and
    dynarl-async keeps every trained token within one version."""
    scn = build_scenario(SimConfig(**{**TINY, "iterations": 4, "warmup": 1,
                                      "policies": ("colocated", "partial", "dynarl-async")}))
    result, runs = simulate(scn)
    n = len(scn.batches[0][0].samples) * len(scn.batches[0])
    for name in ("partial", "dynarl-async"):
        run = runs[name]
        assert [r.samples for r in run.iterations] == [n] * 4
        assert all(groups > 0 and tokens > 0 for groups, tokens, _ in run.carried)
        assert sum(unfinished for _, _, unfinished in run.carried) > 0  # episodes carried mid-way
        assert sum(sum(c.values()) for c in run.staleness_counts) == 4 * n
    assert max(runs["dynarl-async"].staleness) <= 1 and max(runs["partial"].staleness) >= 1
