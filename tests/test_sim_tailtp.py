NUM_GPUS = 0

import pytest

from dynarl.components import costmodel as cm
from dynarl.components.placement.plan import COMPONENTS
from dynarl.launch.sim.runner import run_policy
from dynarl.launch.sim.scenario import SimConfig, build_scenario
from dynarl.core.migration.tail_tp import WIDEN, Engine, widen_pairs

SMALL = dict(workload="math-1.5b", devices=16, prompts=64, iterations=2, warmup=1)


@pytest.mark.parametrize("engines, pairs", [
    ([], []),
    # an engine with requests beside an idle one of its node
    ([Engine(0, 0, 0, True), Engine(1, 0, 2, False)], [(0, 1)]),
    # two engines with requests are not merged, nor two idle ones
    ([Engine(0, 0, 0, True), Engine(1, 0, 2, True)], []),
    ([Engine(0, 0, 0, False), Engine(1, 0, 2, False)], []),
    # never across nodes
    ([Engine(0, 0, 6, True), Engine(1, 1, 8, False)], []),
    # per node in device order, not position order; leftovers stay as they are
    ([Engine(0, 0, 4, True), Engine(1, 0, 0, True), Engine(2, 0, 6, False), Engine(3, 0, 2, False),
      Engine(4, 0, 8, True), Engine(5, 1, 8, True), Engine(6, 1, 10, False)],
     [(1, 3), (0, 2), (5, 6)]),
])
def test_widen_pairs(engines, pairs):
    assert widen_pairs(engines) == pairs


def test_tailtp_runs_wide_engines_in_the_tail_and_returns_to_base_tp():
    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("dynarl-tailtp",)}))
    run = run_policy(scn, "dynarl-tailtp")  # the runner checks every sample reached the trainer once
    tp = scn.rollout_tp
    # a reboot per widening, each at least an engine restart (its devices make no tokens meanwhile)
    restart = cm.role_switch_time(restart=True)
    assert run.migrations.get("reboot") and all(s >= restart for s in run.migrations["reboot"])
    wide = [(s, e) for s, e, width in run.busy if width == WIDEN * tp]
    assert wide, "no engine decoded at the wider TP"
    for rec in run.iterations:
        assert rec.tokens == sum(s.generated_tokens for g in scn.batches[rec.index] for s in g.samples)
        # each iteration starts with base-TP engines only: the wide ones ran after its first move
        first_busy = min(s for s, e, _ in run.busy if rec.start <= s < rec.end)
        assert all(s > first_busy for s, _ in wide if rec.start <= s < rec.end)
    # the devices never double-count: at every change the components hold the cluster at most
    for _, alloc in _events(run):
        assert sum(alloc[c] for c in COMPONENTS) <= scn.num_devices


def _events(run):
    by_time = {}
    for c, n, s, e in run.ownership:
        by_time.setdefault(s, {k: 0 for k in COMPONENTS})[c] += n
    return sorted(by_time.items())


def test_a_widening_whose_export_fails_rolls_back_and_loses_nothing(monkeypatch):
    """The export ran (the engines handed their groups over), then failed: the groups go
    back to their engines, which resume at the base TP; the runner checks every sample
    still reached the trainer exactly once."""
    from dynarl.core.migration.p2p import MigrationFailed
    from dynarl.core.migration import tail_tp
    failed = []

    async def export_then_fail(group, release, exported):
        await tail_tp.export_each.__wrapped__(group, release, exported)
        failed.append(sum(len(items) for items in exported.values()))
        raise MigrationFailed("injected: the export's reply was lost")

    export_then_fail.__wrapped__ = tail_tp.export_each
    monkeypatch.setattr(tail_tp, "export_each", export_then_fail)
    scn = build_scenario(SimConfig(**{**SMALL, "policies": ("dynarl-tailtp",)}))
    run = run_policy(scn, "dynarl-tailtp")
    assert failed and any(failed), "no widening was tried with groups to hand over"
    assert not run.migrations.get("reboot")  # none went through
    assert not [1 for _, _, width in run.busy if width == WIDEN * scn.rollout_tp]
    for rec in run.iterations:
        assert rec.tokens == sum(s.generated_tokens for g in scn.batches[rec.index] for s in g.samples)


async def test_a_rank_joining_a_closed_episode_run_gets_its_end_at_once():
    from dynarl.components.workflows.episodes import EpisodeDriver, ScriptedTurns
    ended = []

    async def submit(key, turn):
        raise AssertionError("nothing to route")

    async def end(key):
        ended.append(key)
    driver = EpisodeDriver(ScriptedTurns({}, 100), ["a"], submit, end=end)
    await driver.run([], lambda: None)
    await driver.close()
    await driver.join(["wide"])  # started during the run, up after every episode ended
    assert ended == ["a", "wide"] and "wide" not in driver.outstanding
