"""decide_dynarl's greedy (greedy.Greedy: memoized times, candidates replaying one
path) against the plain loop it replaced, kept here as the reference: equal Plans,
bit for bit, over a table of views and a seeded sweep of random ones."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from dynarl.core.scheduler.greedy import KvPrefix
from dynarl.core.scheduler.policy import (ClusterView, ComponentView, DynarlConfig, Plan, _give_to_bottlenecks,
                                          _release_options, at_barrier, decide_barrier, decide_dynarl,
                                          demand_engines, is_donor, moved_requests_s, predicted_time)
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel


def reference_give(comps, current, donor, release, receivers, predictor):
    """The loop before session 33, verbatim."""
    allocation = dict(current)
    allocation[donor.name] -= release
    pool = release
    given: dict[str, int] = {}

    def remaining(r):
        rate = predictor.rate(r.name, allocation[r.name], r.devices_per_engine, demand_engines(r))
        return float("inf") if rate <= 0 else r.remaining_work / rate

    def with_unit(r):
        return predicted_time(comps, {**allocation, r.name: allocation[r.name] + r.devices_per_engine}, predictor)
    while True:
        fitting = [r for r in receivers if r.devices_per_engine <= pool]
        if not fitting:
            break
        target = min(fitting, key=lambda r: (with_unit(r), -remaining(r), r.name))
        allocation[target.name] += target.devices_per_engine
        given[target.name] = given.get(target.name, 0) + target.devices_per_engine
        pool -= target.devices_per_engine
    allocation[donor.name] += pool
    return allocation, tuple((donor.name, r, n) for r, n in sorted(given.items()))


def reference_decide(view, predictor, config):
    comps = view.components
    current = {c.name: c.devices for c in comps}
    now_time = predicted_time(comps, current, predictor)
    if at_barrier(comps, predictor) and (plan := decide_barrier(view, predictor, config)) is not None:
        return plan
    best, count = None, 0
    for donor in (c for c in comps if is_donor(c, view.now, config)):
        receivers = [c for c in comps if c.name != donor.name and c.interruptible and c.remaining_work > 0
                     and predictor.knows(c.name)]
        for release in _release_options(donor, config.max_candidates):
            eligible = receivers if release <= donor.idle_engines * donor.devices_per_engine else \
                [c for c in receivers if not c.barrier]
            if not eligible:
                continue
            allocation, moves = reference_give(comps, current, donor, release, eligible, predictor)
            count += 1
            moving = frozenset({donor.name, *(r for _, r, _ in moves)} if config.charge_move_cost else ())
            delays = {donor.name: moved_requests_s(donor, release)} if config.charge_move_cost else None
            t = predicted_time(comps, allocation, predictor, moving, delays)
            if t < now_time and (best is None or t < best.predicted_time_s):
                best = Plan(allocation, moves, t, now_time, 0, sum(c.move_cost_s for c in comps if c.name in moving))
    return None if best is None else replace(best, candidates=count)


def linear(rate_1: float, n: int) -> ThroughputModel:
    return ThroughputModel([(1, rate_1), (n, rate_1 * n)])


def view_of(engines: int, *, tp: int = 2, active: int = 40, idle: int = 0, inference: float = 4e8,
            trainer: float = 6e8, inf_devices: int = 2, trainer_devices: int = 4, trainer_unit: int = 1,
            barrier: bool = True, rollout_work: float = 1e5) -> ClusterView:
    return ClusterView(100.0, (
        ComponentView("rollout", "dynamic", engines * tp, rollout_work, devices_per_engine=tp, min_devices=tp,
                      active_requests=active, keep_engines=max(1, active // 40), engine_low_since=(0.0,) * engines,
                      engine_kv=tuple((i * 37) % 101 for i in range(engines)), moved_token_s=1e-5,
                      idle_engines=idle),
        ComponentView("inference", "static", inf_devices, inference, move_cost_s=2.0),
        ComponentView("trainer", "static", trainer_devices, trainer, devices_per_engine=trainer_unit,
                      barrier=barrier, move_cost_s=3.0)))


def rollout_model(engines: int, tp: int) -> ThroughputModel:
    return ThroughputModel([(e * tp, 900.0 * e ** 0.9) for e in (1, 2, 4, 8, 16, 64, 256, engines) if e <= engines])


def predictor_of(engines: int, tp: int = 2) -> Predictor:
    n = engines * tp + 6
    return Predictor({"rollout": rollout_model(engines, tp), "inference": linear(3e4, n), "trainer": linear(1e4, n)})


CFG = DynarlConfig()


@pytest.mark.parametrize("engines, kw", [
    (16, {}),
    (16, {"idle": 16}),                          # every release may feed the barrier stage too
    (16, {"idle": 4}),                           # the larger releases feed the pipelined stage only
    (64, {"idle": 32, "trainer_unit": 4}),       # receivers of unequal units: the pool's end fits one
    (64, {"idle": 64, "trainer_unit": 3, "barrier": False}),
    (64, {"idle": 64, "rollout_work": 1e9}),    # the donor's time dominates: its D enters every key
    (64, {"idle": 64, "rollout_work": 3e6}),    # D between the receivers' times: paths part midway
    (200, {"idle": 200, "inference": 1e6}),     # one receiver all but done
    (2000, {"idle": 1000}),                     # 4096-device scale
])
def test_greedy_equals_the_plain_loop(engines, kw):
    view, predictor = view_of(engines, **kw), predictor_of(engines)
    for config in (CFG, replace(CFG, charge_move_cost=False)):
        expected = reference_decide(view, predictor, config)
        assert expected is not None
        assert decide_dynarl(view, predictor, config) == expected


def test_give_equals_the_plain_loop_one_release_at_a_time():
    view, predictor = view_of(64, idle=64, trainer_unit=2), predictor_of(64)
    comps = view.components
    current = {c.name: c.devices for c in comps}
    for release in (1, 2, 3, 7, 64, 127, 128):
        assert _give_to_bottlenecks(comps, current, comps[0], release, list(comps[1:]), predictor) == \
            reference_give(comps, current, comps[0], release, list(comps[1:]), predictor)


def reference_moved_requests_s(donor, release):
    """The plain formula KvPrefix replaced: the emptiest engines' KV summed per call."""
    gone = release // donor.devices_per_engine
    kept = len(donor.engine_kv) - gone
    if donor.moved_token_s <= 0 or gone <= 0 or kept <= 0:
        return 0.0
    return sum(sorted(donor.engine_kv)[:gone]) * donor.moved_token_s / kept


def test_kv_prefix_equals_moved_requests_s():
    donor = view_of(50).components[0]
    kv = KvPrefix(donor)
    for release in range(0, 102, 2):
        assert kv.moved_requests_s(release) == moved_requests_s(donor, release) == \
            reference_moved_requests_s(donor, release)


def test_random_views_equal_the_plain_loop():
    rng = random.Random(33)
    for _ in range(300):
        tp = rng.choice((1, 2, 4))
        engines = rng.randint(2, 80)
        n = engines * tp + 16
        models = {"rollout": ThroughputModel([(e * tp, rng.uniform(50, 100) * e) for e in (1, 2, 4, 16, engines)
                                              if e <= engines]),
                  "inference": ThroughputModel([(1, rng.uniform(10, 100)), (n, rng.uniform(1e3, 1e4))]),
                  "trainer": ThroughputModel(sorted({(1, rng.uniform(5, 50)), (rng.randint(2, n), rng.uniform(50, 500)),
                                                     (n, rng.uniform(500, 5e3))}))}
        if rng.random() < 0.2:
            del models[rng.choice(("inference", "trainer"))]
        comps = (
            ComponentView("rollout", "dynamic", engines * tp, rng.choice((0.0, rng.uniform(1e2, 1e6))),
                          devices_per_engine=tp, min_devices=tp, active_requests=rng.randint(0, 3 * engines),
                          keep_engines=rng.choice((None, rng.randint(0, engines))),
                          engine_low_since=tuple(rng.choice((0.0,) * 19 + (None,)) for _ in range(engines)),
                          engine_kv=tuple(rng.randint(0, 1000) for _ in range(engines)),
                          moved_token_s=rng.choice((0.0, 1e-4)), idle_engines=rng.randint(0, engines)),
            ComponentView("inference", "static", rng.randint(1, 8), rng.choice((0.0, rng.uniform(1e3, 1e6))),
                          devices_per_engine=rng.choice((1, 2)), interruptible=rng.random() < 0.9,
                          move_cost_s=rng.uniform(0, 5)),
            ComponentView("trainer", "static", rng.randint(1, 8), rng.uniform(1e3, 1e6),
                          devices_per_engine=rng.choice((1, 2, 3, 4)), barrier=rng.random() < 0.7,
                          move_cost_s=rng.uniform(0, 5)))
        view = ClusterView(100.0, comps)
        config = DynarlConfig(max_candidates=rng.randint(3, 10), charge_move_cost=rng.random() < 0.8)
        predictor = Predictor(models)
        assert decide_dynarl(view, predictor, config) == reference_decide(view, predictor, config)
