NUM_GPUS = 0

import random

import pytest

from dynarl.core.priority import PriorityConfig, bonus_fraction, fifo_key, priority_key

CFG = PriorityConfig(max_bonus_s=10.0, max_tool_count=4, prefix_scale_tokens=100)


@pytest.mark.parametrize("a,b", [
    pytest.param((1, 0), (0, 10_000), id="one-tool-call-beats-any-prefix"),
    pytest.param((2, 50), (2, 10), id="same-tools-longer-prefix-first"),
    pytest.param((4, 0), (3, 999_999), id="max-tools-beats-long-prefix"),
    pytest.param((9, 0), (4, 0), id="tool-count-capped-equal") ,
])
def test_order_of_simultaneous_arrivals(a, b):
    ka = priority_key(0.0, *a, CFG)
    kb = priority_key(0.0, *b, CFG)
    if a[0] > CFG.max_tool_count and b[0] >= CFG.max_tool_count and a[1] == b[1]:
        assert ka == kb
    else:
        assert ka < kb


@pytest.mark.parametrize("tools,prefix", [(0, 0), (4, 0), (4, 10**9), (100, 10**9)])
def test_bonus_stays_below_the_window(tools, prefix):
    assert 0.0 <= bonus_fraction(tools, prefix, CFG) < 1.0


def test_zero_window_is_fifo():
    cfg = PriorityConfig(max_bonus_s=0.0)
    assert priority_key(5.0, 3, 500, cfg) == fifo_key(5.0, 3, 500) == 5.0


def serve(requests, key, per_tick=1):
    """A queue served `per_tick` items each second; returns {id: (arrival, served_at)}."""
    pending, served, t = [], {}, 0.0
    arrivals = sorted(requests, key=lambda r: r[1])
    i = 0
    while i < len(arrivals) or pending:
        while i < len(arrivals) and arrivals[i][1] <= t:
            pending.append(arrivals[i])
            i += 1
        pending.sort(key=lambda r: key(r[1], r[2], r[3], CFG))
        for r in pending[:per_tick]:
            served[r[0]] = (r[1], t)
        pending = pending[per_tick:]
        t += 1.0
    return served


def starving_workload():
    """One plain request at t=0, then a steady stream of high-priority follow-up turns
    (2 per second, served 1 per second) for 200 s."""
    reqs = [("plain", 0.0, 0, 0)]
    reqs += [(f"hot{i}", 0.5 * i, 4, 10_000) for i in range(400)]
    return reqs


def test_pure_priority_starves_but_the_age_term_bounds_the_wait():
    unbounded = PriorityConfig(max_bonus_s=1e9, max_tool_count=4, prefix_scale_tokens=100)
    served = serve(starving_workload(), lambda a, t, p, _: priority_key(a, t, p, unbounded))
    assert served["plain"][1] >= 200  # waited until the stream ended
    served = serve(starving_workload(), priority_key)
    assert served["plain"][1] <= 25  # the window is 10 s: overtaken only by the first ~20 arrivals


@pytest.mark.parametrize("seed", range(5))
def test_only_requests_arriving_within_the_window_overtake(seed):
    rng = random.Random(seed)
    reqs = [(f"r{i}", rng.uniform(0, 100), rng.randint(0, 6), rng.randint(0, 5000)) for i in range(300)]
    served = serve(reqs, priority_key)  # one per tick: the serving order is unambiguous
    for r in reqs:
        for s in reqs:
            overtook = served[s[0]][1] < served[r[0]][1] and s[1] > r[1]
            if overtook:
                assert s[1] - r[1] < CFG.max_bonus_s


# --- the assumption checked on finished turns (TurnLengths) ------------------------------

@pytest.mark.parametrize("first, later, expected", [
    ([100] * 15, [50] * 20, None),     # too few first turns seen yet
    ([100] * 20, [50] * 15, None),     # too few later ones
    ([100] * 16, [50] * 16, True),     # later turns shorter: the priority's case (agentic-rstar)
    ([100] * 16, [100] * 16, True),    # equal: keep the priority
    ([100] * 16, [150] * 16, False),   # later turns longer: refuted (agentic-rstar-grow)
])
def test_turn_lengths_check_the_priority_assumption(first, later, expected):
    from dynarl.core.priority import TurnLengths
    lengths = TurnLengths()
    for n in first:
        lengths.observe(0, n)
    for k, n in enumerate(later):
        lengths.observe(1 + k % 3, n)
    assert lengths.later_turns_shorter() is expected


def test_a_refuted_assumption_turns_the_queue_key_fifo():
    from dynarl.components.rollout.base import GenerationRequest, SamplingParams
    from dynarl.components.rollout.queue_keys import make_queue_key
    from dynarl.core.priority import TurnLengths
    lengths = TurnLengths(min_samples=2)
    key = make_queue_key("priority", PriorityConfig(max_bonus_s=30.0), lengths=lengths)
    early = GenerationRequest("a", [1], SamplingParams(), tool_count=0, arrival_time=10.0)
    late = GenerationRequest("b", [1], SamplingParams(), tool_count=3, arrival_time=12.0)
    assert key(late, 0) < key(early, 0)  # priority: more tool calls first, within the window
    for n in (100, 100):
        lengths.observe(0, n)
    for n in (300, 300):
        lengths.observe(2, n)
    assert key(early, 0) == 10.0 and key(late, 0) == 12.0  # FIFO from now on


# --- learned per turn index (TurnLengths.turn_keeps_bonus) --------------------------------

def _learned(turns: dict[int, list[int]], min_samples: int = 16):
    from dynarl.core.priority import TurnLengths
    lengths = TurnLengths(min_samples=min_samples)
    for tool_count, outputs in turns.items():
        for n in outputs:
            lengths.observe(tool_count, n)
    return lengths


@pytest.mark.parametrize("turns, tool_count, expected", [
    pytest.param({}, 3, True, id="nothing-seen-keeps-the-priority"),
    pytest.param({0: [100] * 16, 1: [50] * 16}, 1, True, id="shorter-index-keeps-it"),
    pytest.param({0: [100] * 16, 1: [100] * 16}, 1, True, id="equal-keeps-it"),
    pytest.param({0: [100] * 16, 1: [50] * 16, 2: [150] * 16}, 2, False, id="longer-index-loses-it"),
    pytest.param({0: [100] * 16, 1: [50] * 16, 2: [150] * 16}, 1, True, id="the-other-indices-keep-it"),
    pytest.param({0: [100] * 16, 1: [50] * 16, 2: [150] * 16}, 0, True, id="first-turns-keep-their-prefix-term"),
    pytest.param({0: [100] * 16, 1: [20] * 40, 2: [300] * 15}, 2, True, id="too-few-at-the-index-pooled-says-shorter"),
    pytest.param({0: [100] * 16, 1: [20] * 40, 2: [300] * 15}, 5, True, id="unseen-index-pooled-says-shorter"),
    pytest.param({0: [100] * 16, 1: [150] * 16}, 0, False, id="pooled-refuted-all-fifo"),
    pytest.param({0: [100] * 16, 1: [150] * 16}, 4, False, id="pooled-refuted-unseen-index-fifo"),
    pytest.param({0: [100] * 15, 1: [50] * 16, 2: [150] * 16}, 2, True, id="too-few-first-turns"),
    pytest.param({0: [100] * 16, 16: [50] * 8, 20: [50] * 8}, 30, True, id="indices-past-the-cap-pool"),
    pytest.param({0: [100] * 16, 1: [10] * 40, 16: [150] * 8, 20: [150] * 8}, 17, False, id="capped-class-longer"),
])
def test_turn_keeps_bonus_per_turn_index(turns, tool_count, expected):
    assert _learned(turns).turn_keeps_bonus(tool_count) is expected


def test_the_learned_key_keys_fifo_only_the_refuted_index():
    from dynarl.components.rollout.base import GenerationRequest, SamplingParams
    from dynarl.components.rollout.queue_keys import make_queue_key
    lengths = _learned({0: [100] * 2, 1: [20] * 6, 2: [300] * 2}, min_samples=2)
    assert lengths.later_turns_shorter() is True  # pooled: (6*20 + 2*300) / 8 = 90 < 100
    key = make_queue_key("priority", PriorityConfig(max_bonus_s=30.0), lengths=lengths)

    def at(tools, arrival):
        return key(GenerationRequest("r", [1], SamplingParams(), tool_count=tools, arrival_time=arrival), 0)
    assert at(2, 12.0) == 12.0                                   # long turn index: FIFO
    assert at(1, 12.0) == priority_key(12.0, 1, 0, PriorityConfig(max_bonus_s=30.0))
    assert at(1, 11.0) < at(0, 10.0) < at(2, 11.0)  # index 1 overtakes an older first turn; index 2 does not
