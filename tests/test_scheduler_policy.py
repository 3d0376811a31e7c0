NUM_GPUS = 0

from dataclasses import replace

import pytest

from dynarl.core.scheduler.policy import (ClusterView, ComponentView, DynarlConfig, _give_to_bottlenecks,
                                          _release_options, at_barrier, decide_barrier, decide_dynarl,
                                          is_donor, moved_requests_s, predicted_time, track_low)
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel

CFG = DynarlConfig(theta=0.8, u_low=0.2, window_s=4.0, max_candidates=8)


def predictor():
    return Predictor({
        "rollout": ThroughputModel([(1, 100.0), (8, 800.0)]),     # tokens/s, per engine of 1 device
        "trainer": ThroughputModel([(1, 50.0), (8, 400.0)]),      # samples/s, linear
        "inference": ThroughputModel([(1, 200.0), (8, 1600.0)]),
    })


def rollout(low=7, since=0.0, active=1, devices=8, per_engine=1, interruptible=True, work=50.0):
    engines = devices // per_engine
    lows = tuple([since] * low + [None] * (engines - low))
    return ComponentView("rollout", "dynamic", devices, work, devices_per_engine=per_engine,
                         active_requests=active, engine_low_since=lows, interruptible=interruptible)


def trainer(devices=8, work=1000.0, interruptible=True, per_engine=1):
    return ComponentView("trainer", "static", devices, work, devices_per_engine=per_engine,
                         interruptible=interruptible)


@pytest.mark.parametrize("component,now,expected", [
    pytest.param(rollout(low=7), 10.0, True, id="7-of-8-low-long-enough"),
    pytest.param(rollout(low=7), 3.0, False, id="low-but-window-not-reached"),
    pytest.param(rollout(low=6), 10.0, False, id="exactly-theta-is-not-more"),
    pytest.param(rollout(low=0), 10.0, False, id="busy"),
    pytest.param(rollout(low=8, interruptible=False), 10.0, False, id="not-at-interruptible-point"),
    pytest.param(trainer(), 10.0, False, id="static-never-donates"),
])
def test_donor_detection(component, now, expected):
    assert is_donor(component, now, CFG) is expected


def test_long_tail_moves_idle_rollout_devices_to_the_trainer():
    snap = ClusterView(now=10.0, components=(rollout(low=7, active=1), trainer()))
    plan = decide_dynarl(snap, predictor(), CFG)
    assert plan is not None
    assert plan.allocation["rollout"] == 1 and plan.allocation["trainer"] == 15
    assert plan.moves == (("rollout", "trainer", 7),)
    assert plan.predicted_time_s < plan.current_time_s
    assert 3 <= plan.candidates <= 10
    assert sum(plan.allocation.values()) == 16


@pytest.mark.parametrize("snapshot", [
    pytest.param(ClusterView(10.0, (rollout(low=0, active=8), trainer())), id="rollout-busy"),
    pytest.param(ClusterView(10.0, (rollout(low=7), trainer(work=0.0))), id="nothing-to-speed-up"),
    pytest.param(ClusterView(10.0, (rollout(low=7), trainer(interruptible=False))), id="receiver-busy"),
    pytest.param(ClusterView(10.0, (rollout(low=8, active=8), trainer())), id="every-engine-still-has-a-request"),
])
def test_no_plan(snapshot):
    assert decide_dynarl(snapshot, predictor(), CFG) is None


def test_rollout_tp2_moves_whole_engines_and_keeps_those_with_requests():
    snap = ClusterView(10.0, (rollout(low=4, active=1, devices=8, per_engine=2), trainer()))
    plan = decide_dynarl(snap, predictor(), CFG)
    assert plan is not None and plan.allocation["rollout"] % 2 == 0 and plan.allocation["rollout"] >= 2


def test_freed_devices_go_to_the_bottleneck_first():
    inference = ComponentView("inference", "static", 2, 2000.0)  # 2000/(2*200)=5 s left
    snap = ClusterView(10.0, (rollout(low=7, active=1), trainer(devices=8, work=100.0), inference))
    plan = decide_dynarl(snap, predictor(), CFG)
    assert plan is not None
    assert dict((r, n) for _, r, n in plan.moves).get("inference", 0) > 0


def test_predicted_time_is_the_slowest_stage():
    comps = (rollout(work=800.0, active=8), trainer(work=400.0))
    assert predicted_time(comps, {"rollout": 8, "trainer": 8}, predictor()) == pytest.approx(1.0)
    assert predicted_time(comps, {"rollout": 8, "trainer": 4}, predictor()) == pytest.approx(2.0)


@pytest.mark.parametrize("devices,expected", [(1, 100.0), (4, 400.0), (8, 800.0), (16, 1600.0)])
def test_model_interpolates_and_extrapolates(devices, expected):
    assert ThroughputModel([(1, 100.0), (8, 800.0)]).rate(devices) == pytest.approx(expected)


def test_online_correction_follows_measurements():
    model = ThroughputModel([(1, 100.0), (8, 800.0)], smoothing=0.5)
    model.observe(4, 200.0)  # half of what was profiled
    assert model.rate(4) == pytest.approx(200.0)
    model.observe(4, 400.0)
    assert model.rate(4) == pytest.approx(0.5 * 200.0 + 0.5 * 400.0)


def test_demand_cap_makes_rollout_concave():
    p = predictor()
    assert p.rate("rollout", 8, 1, demand_cap=2) == p.rate("rollout", 2, 1) == pytest.approx(200.0)


# --- the tail of a real job: batching engines, a barrier trainer, measured move costs --------
def _tail(move_cost=(0.0, 0.0), per_engine=64, active=20, trainer_work=256.0, barrier=False):
    """3 rollout engines past their last prompt, 20 sequences left (tokens/s: 100 per engine);
    a trainer on 1 device (50 samples/s each) that streams, or steps on the whole batch
    after generation (`barrier`)."""
    r = ComponentView("rollout", "dynamic", 3, 200.0, active_requests=active, requests_per_engine=per_engine,
                      engine_low_since=(0.0, 0.0, 0.0), move_cost_s=move_cost[0])
    t = ComponentView("trainer", "static", 1, trainer_work, barrier=barrier, move_cost_s=move_cost[1])
    return ClusterView(10.0, (r, t))


def test_a_barrier_trainer_adds_its_time_to_the_pipelined_stages():
    snap = _tail(barrier=True)
    # rollout: 200 tokens / rate(min(3, 1 engine the 20 requests need)) = 2 s; then 256 / 50 s.
    assert predicted_time(snap.components, {"rollout": 3, "trainer": 1}, predictor()) == pytest.approx(2.0 + 5.12)
    assert predicted_time(snap.components, {"rollout": 1, "trainer": 3}, predictor()) == pytest.approx(2.0 + 5.12 / 3)


@pytest.mark.parametrize("per_engine,expected_release", [
    pytest.param(64, 2, id="20-requests-fit-one-batching-engine"),
    pytest.param(8, 0, id="20-requests-need-all-3-engines-of-8"),
    pytest.param(1, 0, id="one-request-per-engine"),
])
def test_requests_per_engine_sets_the_engines_to_keep(per_engine, expected_release):
    plan = decide_dynarl(_tail(per_engine=per_engine), predictor(), CFG)
    released = 0 if plan is None else sum(n for _, _, n in plan.moves)
    assert released == expected_release


@pytest.mark.parametrize("costs,moves", [
    pytest.param((0.0, 0.0), True, id="free-moves"),
    pytest.param((0.05, 3.0), True, id="cheaper-than-the-gain"),   # gain 5.12 * 2/3 = 3.41 s
    pytest.param((0.05, 3.5), False, id="costlier-than-the-gain"),
    pytest.param((3.5, 0.0), False, id="the-donor-pays-too"),        # rollout 2 s + 3.5 s now slowest
])
def test_a_move_is_made_only_if_it_pays_for_its_measured_cost(costs, moves):
    plan = decide_dynarl(_tail(move_cost=costs), predictor(), CFG)
    assert (plan is not None) is moves
    if plan is not None:
        assert plan.migration_cost_s == pytest.approx(sum(costs))
        assert plan.predicted_time_s < plan.current_time_s


def test_charge_off_ignores_measured_costs():
    free = DynarlConfig(theta=0.8, u_low=0.2, window_s=4.0, max_candidates=8, charge_move_cost=False)
    assert decide_dynarl(_tail(move_cost=(0.05, 3.5)), predictor(), free) is not None


@pytest.mark.parametrize("keep,demand_per_engine,options", [
    pytest.param(None, 8, [], id="no-floor-given-keeps-the-demand-3-of-3"),
    pytest.param(1, 8, [1, 2], id="floor-1-may-pack-below-demand"),
    pytest.param(2, 64, [1], id="floor-2-keeps-more-than-the-demand-of-1"),
    pytest.param(None, 64, [1, 2], id="no-floor-given-keeps-the-demand-1"),
])
def test_keep_engines_is_the_donors_floor(keep, demand_per_engine, options):
    """keep_engines replaces the demand (20 requests at `demand_per_engine` each) as the
    floor of what the donor may release, in engines of one device."""
    r = ComponentView("rollout", "dynamic", 3, 200.0, active_requests=20, requests_per_engine=demand_per_engine,
                      keep_engines=keep, engine_low_since=(0.0, 0.0, 0.0))
    assert _release_options(r, 8) == options


def test_packing_below_demand_is_priced_by_the_demand_cap():
    """With a floor under the demand the plan may release more, and the predictor prices
    the rollout on fewer engines than its requests need as slower (rate(min(devices, demand)))."""
    r = ComponentView("rollout", "dynamic", 3, 200.0, active_requests=20, requests_per_engine=8,
                      keep_engines=1, engine_low_since=(0.0, 0.0, 0.0))
    t = ComponentView("trainer", "static", 1, 2560.0)
    plan = decide_dynarl(ClusterView(10.0, (r, t)), predictor(), CFG)
    assert plan is not None and plan.moves == (("rollout", "trainer", 2),)
    # rollout on 1 engine: 200 / 100 = 2 s; trainer on 3 devices: 2560 / 150 = 17.1 s
    assert plan.predicted_time_s == pytest.approx(2560.0 / 150.0)


@pytest.mark.parametrize("engines, util, since, peak, expected_since, expected_peak", [
    pytest.param(["a"], [0.0], {}, {}, {"a": 5.0}, {"a": 0.0}, id="never-held-a-request-is-low"),
    pytest.param(["a"], [0.1], {}, {}, {"a": None}, {"a": 0.1}, id="filling-below-u-low-is-not-low"),
    pytest.param(["a"], [0.1], {}, {"a": 0.6}, {"a": 5.0}, {"a": 0.6}, id="draining-below-u-low-is-low"),
    pytest.param(["a"], [0.1], {"a": 2.0}, {"a": 0.6}, {"a": 2.0}, {"a": 0.6}, id="stays-low-since-first-seen"),
    pytest.param(["a"], [0.3], {"a": 2.0}, {"a": 0.6}, {"a": None}, {"a": 0.6}, id="above-u-low-resets"),
    pytest.param(["b"], [0.7], {"a": 2.0}, {"a": 0.6}, {"b": None}, {"a": 0.6, "b": 0.7},
                 id="a-released-engine-drops-out-its-peak-stays"),
])
def test_track_low(engines, util, since, peak, expected_since, expected_peak):
    """Both commands' donor signal (the managers' poll)."""
    assert track_low(engines, util, 5.0, since, peak, 0.2)[:2] == (expected_since, expected_peak)


def test_an_engine_that_may_still_get_prompts_is_never_low_one_that_may_not_drains_past_its_peak():
    # a and b at their peak: neither is low (b took its last prompt, but its requests still
    # decode and fill its KV); c is past its peak: low once it may get no more prompts
    since, _, _ = track_low(["a", "b", "c"], [0.1, 0.1, 0.1], 5.0, {}, {"a": 0.1, "b": 0.1, "c": 0.3}, 0.2,
                            admitting=[True, False, False])
    assert since == {"a": None, "b": None, "c": 5.0}
    since, _, _ = track_low(["c"], [0.1], 5.0, {}, {"c": 0.3}, 0.2, admitting=[True])
    assert since == {"c": None}


@pytest.mark.parametrize("held, held_peak, low", [
    pytest.param(4, 8, True, id="half-its-requests-finished-drains-though-its-kv-still-grows"),
    pytest.param(5, 8, False, id="its-first-requests-finished-it-still-fills"),
    pytest.param(8, 8, False, id="all-its-requests-still-running-fills"),
])
def test_an_engine_at_its_peak_fill_drains_once_its_requests_finish(held, held_peak, low):
    """A small engine's tail can hold all the KV it ever held (its long requests still
    decode) while most of its requests are done: it drains by requests."""
    since, _, peaks = track_low(["a"], [0.1], 5.0, {}, {"a": 0.1}, 0.2, admitting=[False], held=[held],
                                held_peak={"a": held_peak})
    assert (since["a"] is not None) is low and peaks == {"a": held_peak}


async def test_the_manager_reads_the_engines_fill_and_admitting_flag_into_the_hypergraph():
    """A rollout rank reports its KV fill and whether it may still be handed prompts:
    never low while admitting, low below U_low and past its peak once it is not
    (dynarl train's tail); the hypergraph holds the fill and the requests."""
    from types import SimpleNamespace

    from dynarl.core.scheduler.manager import ComponentSpec, Manager
    from dynarl.core.scheduler.report import RankReport

    def report(kv, admitting):
        return RankReport(utilization=kv, admitting=admitting, running=1, capacity=1)

    polls = iter([
        [report(0.30, True), report(0.30, True)],     # may still get prompts
        [report(0.10, False), report(0.10, True)],    # a: in the tail, below U_low, past its peak
        [report(0.15, False), report(0.50, False)],   # b: above U_low
    ])

    class Group:
        cls, devices = SimpleNamespace(__name__="RolloutWorker"), [0, 1]
        handles = [SimpleNamespace(spec=SimpleNamespace(worker_id=w)) for w in ("rollout/0/a", "rollout/1/b")]

        async def call(self, method):
            return next(polls)

    manager = Manager(ComponentSpec("rollout", "dynamic"), Group(), u_low=0.2)
    expected = {1.0: (None, None), 2.0: (2.0, None), 3.0: (2.0, None)}
    for now in (1.0, 2.0, 3.0):
        await manager.poll(now)
        assert manager.low() == expected[now], now
    assert manager.graph.nodes["rollout"].loads() == ((0.15, 0.50), (1, 1))  # the hypergraph holds the KV fill


@pytest.mark.parametrize("engine_kv, per_engine, release, token_s, expected", [
    pytest.param((100, 300, 600, 0), 1, 2, 0.01, 100 * 0.01 / 2, id="the-two-emptiest-go-shared-by-two"),
    pytest.param((100, 300, 600, 0), 1, 1, 0.01, 0.0, id="an-idle-engine-moves-nothing"),
    pytest.param((100, 300, 600, 0), 1, 2, 0.0, 0.0, id="cost-not-known-not-charged"),
    pytest.param((100, 300), 1, 2, 0.01, 0.0, id="no-engine-kept"),
    pytest.param((100, 300), 2, 2, 0.01, 100 * 0.01, id="tp2-one-engine-goes"),
    pytest.param((), 1, 2, 0.01, 0.0, id="no-reports"),
])
def test_moved_requests_s(engine_kv, per_engine, release, token_s, expected):
    donor = ComponentView("rollout", "dynamic", len(engine_kv) * per_engine, 100.0, devices_per_engine=per_engine,
                          engine_kv=engine_kv, moved_token_s=token_s)
    assert moved_requests_s(donor, release) == pytest.approx(expected)


@pytest.mark.parametrize("token_s, moves", [
    pytest.param(0.0, (("rollout", "trainer", 2),), id="kv-moves-with-them-packs-onto-one-engine"),
    pytest.param(0.02, (("rollout", "trainer", 1),), id="re-prefill-keeps-two-engines"),
    pytest.param(1.0, None, id="re-prefill-costlier-than-any-gain"),
])
def test_the_context_moved_requests_compute_again_is_charged_to_the_donor(token_s, moves):
    """Three engines of 1000 KV tokens each, floor one engine: releasing two makes the
    kept one compute 2000 moved tokens again, releasing one 1000 shared by two. The
    trainer (2560 samples) is the bottleneck: 51.2 s on 1 device, 25.6 on 2, 17.1 on 3."""
    r = ComponentView("rollout", "dynamic", 3, 200.0, active_requests=20, requests_per_engine=8,
                      keep_engines=1, engine_low_since=(0.0, 0.0, 0.0), engine_kv=(1000, 1000, 1000),
                      moved_token_s=token_s)
    t = ComponentView("trainer", "static", 1, 2560.0)
    plan = decide_dynarl(ClusterView(10.0, (r, t)), predictor(), CFG)
    assert (plan.moves if plan is not None else None) == moves
    if token_s == 0.02:  # release 2: 2000 x 0.02 s on the kept engine (+2 s decode) = 42 s > 25.6 s
        assert plan.predicted_time_s == pytest.approx(2560.0 / 100.0)
    free = DynarlConfig(theta=0.8, u_low=0.2, window_s=4.0, max_candidates=8, charge_move_cost=False)
    assert decide_dynarl(ClusterView(10.0, (r, t)), predictor(), free).moves == (("rollout", "trainer", 2),)


@pytest.mark.parametrize("inference_work, trainer_work, to_inference, to_trainer", [
    # a barrier trainer's time adds to inference's: each of 2 freed devices saves
    # inference (1 device: 1000/200 = 5 s -> 2.5 s -> 1.67 s) more than the trainer
    # (4 devices: 700/50/4 = 3.5 s -> 2.8 s), though the trainer would finish last
    (1000.0, 700.0, 2, 0),
    # with little inference left, the trainer's devices save most
    (100.0, 700.0, 0, 2),
    # one each: inference's first device saves 2.5 s against the trainer's 2 s; its
    # second 0.83 s against the trainer's 1.33 s
    (1000.0, 2000.0, 1, 1),
])
def test_freed_devices_go_where_they_shorten_the_step_with_a_barrier_trainer(inference_work, trainer_work,
                                                                             to_inference, to_trainer):
    inference = ComponentView("inference", "static", 1, inference_work)
    barrier = ComponentView("trainer", "static", 4, trainer_work, barrier=True)
    donor = rollout(low=3, active=1, devices=4)
    comps = (donor, inference, barrier)
    allocation, moves = _give_to_bottlenecks(comps, {"rollout": 4, "inference": 1, "trainer": 4}, donor, 2,
                                             [inference, barrier], predictor())
    given = {r: n for _, r, n in moves}
    assert (given.get("inference", 0), given.get("trainer", 0)) == (to_inference, to_trainer)
    assert allocation == {"rollout": 2, "inference": 1 + to_inference, "trainer": 4 + to_trainer}


# --- the barrier: a barrier stage takes devices only once the pipelined stages are done ------
@pytest.mark.parametrize("idle, barrier, moves", [
    (0, False, (("rollout", "trainer", 2),)),  # a streaming trainer takes them
    (0, True, None),   # a device given to it would idle until the barrier: no request moves for that
    (1, True, (("rollout", "trainer", 1),)),   # an engine holding no request goes at no cost to the rollout
    (2, True, (("rollout", "trainer", 2),)),
])
def test_before_the_barrier_a_barrier_trainer_takes_only_idle_engines(idle, barrier, moves):
    view = _tail(barrier=barrier)
    rollout_ = replace(view.components[0], idle_engines=idle)
    plan = decide_dynarl(ClusterView(view.now, (rollout_, view.components[1])), predictor(), CFG)
    assert (plan.moves if plan is not None else None) == moves


def test_before_the_barrier_the_freed_devices_go_to_inference():
    inference = ComponentView("inference", "static", 1, 1000.0)
    barrier = ComponentView("trainer", "static", 4, 5000.0, barrier=True)
    plan = decide_dynarl(ClusterView(10.0, (rollout(low=4, active=1, devices=4), inference, barrier)), predictor(), CFG)
    assert {r for _, r, _ in plan.moves} == {"inference"}


def _finished(name, devices, kind="static", per_engine=1):
    return ComponentView(name, kind, devices, 0.0, devices_per_engine=per_engine, finished=True,
                         interruptible=False)


@pytest.mark.parametrize("comps, charge, moves", [
    # the rollout's last engine (2 devices) and inference's 3: all 5 to the trainer
    pytest.param((_finished("rollout", 2, "dynamic", 2), _finished("inference", 3),
                  ComponentView("trainer", "static", 3, 1000.0, barrier=True)), False,
                 (("rollout", "trainer", 2), ("inference", "trainer", 3)), id="every-finished-device"),
    # a trainer of TP 2 takes whole units: 4 of the 5
    pytest.param((_finished("rollout", 2, "dynamic", 2), _finished("inference", 3),
                  ComponentView("trainer", "static", 2, 1000.0, barrier=True, devices_per_engine=2)), False,
                 (("rollout", "trainer", 2), ("inference", "trainer", 2)), id="in-the-trainers-units"),
    # inference still has work: not the barrier yet
    pytest.param((_finished("rollout", 2, "dynamic", 2), ComponentView("inference", "static", 3, 10.0),
                  ComponentView("trainer", "static", 3, 1000.0, barrier=True)), False, None, id="not-at-the-barrier"),
    # 1000 / (3 x 50) = 6.67 s now, 1000 / (8 x 50) = 2.5 s after: a move of 4 s pays, of 5 s not
    pytest.param((_finished("inference", 5), ComponentView("trainer", "static", 3, 1000.0, barrier=True,
                                                           move_cost_s=4.0)), True,
                 (("inference", "trainer", 5),), id="pays-for-its-cost"),
    pytest.param((_finished("inference", 5), ComponentView("trainer", "static", 3, 1000.0, barrier=True,
                                                           move_cost_s=5.0)), True, None, id="costs-more-than-it-saves"),
    # inference shares one of its 3 devices with the trainer (hybrid): it can lend 2
    pytest.param((replace(_finished("inference", 3), lendable=2),
                  ComponentView("trainer", "static", 3, 1000.0, barrier=True)), False,
                 (("inference", "trainer", 2),), id="not-the-devices-the-trainer-holds"),
    pytest.param((replace(_finished("inference", 3), lendable=0),
                  ComponentView("trainer", "static", 3, 1000.0, barrier=True)), False, None, id="all-shared"),
    # a stage with no work left that has not finished (its stage still open) lends nothing
    pytest.param((ComponentView("inference", "static", 5, 0.0),
                  ComponentView("trainer", "static", 3, 1000.0, barrier=True)), False, None, id="not-finished"),
])
def test_at_the_barrier_the_finished_stages_lend_it_their_devices(comps, charge, moves):
    config = DynarlConfig(charge_move_cost=charge)
    view = ClusterView(10.0, comps)
    plan = decide_dynarl(view, predictor(), config)
    assert (plan.moves if plan is not None else None) == moves
    if plan is not None:
        assert plan.barrier and plan.predicted_time_s < plan.current_time_s
        assert plan == decide_barrier(view, predictor(), config)
        assert sum(plan.allocation.values()) == sum(c.devices for c in comps)


def test_at_barrier_counts_only_the_stages_the_predictor_knows():
    unknown = ComponentView("reward", "static", 1, 50.0)
    trainer_ = ComponentView("trainer", "static", 3, 1000.0, barrier=True)
    assert at_barrier((_finished("inference", 2), unknown, trainer_), predictor())
    assert not at_barrier((ComponentView("inference", "static", 2, 1.0), trainer_), predictor())


def test_at_the_barrier_with_nothing_to_lend_the_rollouts_idle_engines_still_move():
    """The rollout has no work left but its stage is still open (not finished): no
    barrier plan, and the usual decision runs (its idle engines may go to the trainer)."""
    r = replace(rollout(low=4, active=0, devices=4, work=0.0), idle_engines=4)
    barrier = ComponentView("trainer", "static", 1, 1000.0, barrier=True)
    plan = decide_dynarl(ClusterView(10.0, (r, barrier)), predictor(), CFG)
    assert plan is not None and not plan.barrier and plan.moves == (("rollout", "trainer", 3),)


def test_a_rank_report_crosses_the_wire_as_itself():
    from dynarl.core.scheduler.report import RankReport
    from dynarl.transport.wire import Codec, WireError

    sent, codec = RankReport(utilization=0.5, admitting=True, running=3, step_s=0.02), Codec(b"s" * 32)
    assert codec.decode(codec.encode([sent])) == [sent]
    frames = codec.encode([RankReport(tokens="x")])  # sent as it is, refused where it arrives
    with pytest.raises(WireError, match="bad RankReport: tokens: expected a number"):
        codec.decode(frames)
