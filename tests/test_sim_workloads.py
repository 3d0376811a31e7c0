NUM_GPUS = 0

import json
import math

import numpy as np
import pytest

from dynarl.components.workloads.catalog import WORKLOADS, get_workload, prompts_for
from dynarl.components.workloads.generate import generate
from dynarl.components.workloads.spec import LogNormal
from dynarl.components.workloads.trace import TraceError, batch_of, parse_trace


def lengths(name, seed=0, prompts=None):
    groups = generate(get_workload(name), seed, 0, prompts)
    return np.array([[s.response_tokens for s in g.samples] for g in groups])


@pytest.mark.parametrize("name, median, cap", [
    pytest.param("math-7b", 4096, 27_648, id="paper_setup"),
    pytest.param("math-1.5b-zero", 450, 16_384, id="zero"),
    pytest.param("math-32b-longcot", 8192, 27_000, id="longcot"),
])
def test_math_lengths_have_the_catalog_median_cap_and_truncation(name, median, cap):
    w = get_workload(name)
    x = lengths(name, prompts=2048)  # 32k samples
    assert np.median(x) == pytest.approx(median, rel=0.04)
    assert x.max() == cap and x.min() >= 1
    d = w.response_tokens  # P(a log-normal draw exceeds the cap), before clipping
    truncated = 0.5 * math.erfc(math.log(d.cap / d.median) / d.sigma / math.sqrt(2))
    assert (x == cap).mean() == pytest.approx(truncated, abs=0.006)


@pytest.mark.parametrize("name", ["math-7b", "math-1.5b-zero"])
def test_samples_of_one_prompt_share_half_their_log_variance(name):
    logs = np.log(lengths(name, prompts=2048))
    between = logs.mean(axis=1).var(ddof=1)
    within = logs.var(axis=1, ddof=1).mean()
    k = logs.shape[1]
    icc = (between - within / k) / (between - within / k + within)  # one-way ANOVA intraclass correlation
    assert icc == pytest.approx(get_workload(name).prompt_correlation, abs=0.05)


def test_generation_is_deterministic_and_seeded():
    w = get_workload("agentic-rstar")
    assert generate(w, 3, 1) == generate(w, 3, 1)
    assert generate(w, 3, 1) != generate(w, 4, 1)
    assert generate(w, 3, 1) != generate(w, 3, 2)


@pytest.mark.parametrize("name", ["agentic-rstar-7b", "agentic-search-1.5b"])
def test_agentic_episodes_respect_turn_and_token_budgets(name):
    w = get_workload(name)
    groups = generate(w, 0, 0)
    episodes = [s for g in groups for s in g.samples]
    assert len(groups) == w.prompts and len(episodes) == w.prompts * w.samples
    turns = [len(s.turns) for s in episodes]
    assert max(turns) <= w.max_turns and min(turns) >= 1
    assert all(s.generated_tokens <= w.max_response_tokens for s in episodes)
    assert all(s.turns[-1].tool_latency_s == 0 and s.turns[-1].obs_tokens == 0 for s in episodes)
    assert all(t.gen_tokens <= w.first_turn_tokens.cap for s in episodes for t in s.turns)
    calls = [t.tool_latency_s for s in episodes for t in s.turns[:-1]]
    assert np.median(calls) == pytest.approx(w.tool_latency_s.median, rel=0.15)


def test_round_zero_is_the_longest_turn_on_average():
    groups = generate(get_workload("agentic-rstar"), 0, 0)
    first = [s.turns[0].gen_tokens for g in groups for s in g.samples if len(s.turns) > 2]
    third = [s.turns[2].gen_tokens for g in groups for s in g.samples if len(s.turns) > 2]
    assert np.mean(first) > 1.5 * np.mean(third)


def test_adversarial_traces_break_the_priority_assumption():
    """agentic-rstar-grow: every later turn longer on average; agentic-rstar-bimodal: a
    quarter of the episodes grow and the rest shrink, so that a later turn is shorter on
    average and yet the turn index does not tell a long later turn from a short one."""
    def by_turn(name):
        eps = [s for g in generate(get_workload(name), 0, 0) for s in g.samples if len(s.turns) > 2]
        return eps, [np.mean([s.turns[k].gen_tokens for s in eps]) for k in range(3)]
    _, grow = by_turn("agentic-rstar-grow-32b")
    assert grow[0] < grow[1] < grow[2]
    _, bimodal = by_turn("agentic-rstar-bimodal")
    assert bimodal[1] < bimodal[0]
    import dataclasses
    w = get_workload("agentic-rstar-bimodal")
    plain = generate(dataclasses.replace(w, long_fraction=0.0), 0, 0)
    both = [(s, t) for g, h in zip(generate(w, 0, 0), plain) for s, t in zip(g.samples, h.samples) if min(len(s.turns), len(t.turns)) > 2]
    ratio = np.array([s.turns[2].gen_tokens / t.turns[2].gen_tokens for s, t in both])
    grown = ratio > 2  # the same draw x1.8^2 = 3.24 instead of x0.5^2 = 0.25 (or cut by the budget)
    assert 0.15 < grown.mean() < 0.35


def test_a_bimodal_draw_leaves_the_other_draws_alone():
    """long_fraction draws after everything else: turn counts, observations and tool
    latencies are those of the same workload without it, and so are the short episodes."""
    import dataclasses
    bimodal = get_workload("agentic-rstar-bimodal")
    plain = dataclasses.replace(bimodal, long_fraction=0.0)
    for a, b in zip(generate(bimodal, 2, 1), generate(plain, 2, 1)):
        assert a.prompt_tokens == b.prompt_tokens
        for x, y in zip(a.samples, b.samples):
            assert [t.obs_tokens for t in x.turns][:-1] == [t.obs_tokens for t in y.turns][:-1] or \
                len(x.turns) != len(y.turns)  # the token budget may cut a grown episode short
            assert x.turns[0].gen_tokens == y.turns[0].gen_tokens


@pytest.mark.parametrize("devices, expected", [(64, 512), (128, 512), (256, 512), (1024, 2048), (4096, 8192)])
def test_batch_scales_past_256_devices(devices, expected):
    assert prompts_for(get_workload("math-7b"), devices) == expected


def test_every_catalog_entry_is_valid_and_named_after_itself():
    for name, w in WORKLOADS.items():
        assert w.name == name
    with pytest.raises(ValueError, match="unknown workload"):
        get_workload("math-70b")
    with pytest.raises(ValueError, match="median"):
        LogNormal(median=0, sigma=1)


# --- traces -------------------------------------------------------------------

SINGLE = [
    json.dumps({"prompt_id": "a", "response_tokens": 10}),
    json.dumps({"prompt_id": "a", "response_tokens": 20, "prompt_tokens": 99}),
    "",
    "{not json",
    json.dumps({"prompt_id": "b", "response_tokens": 0}),
    json.dumps({"prompt_id": "b", "response_tokens": 5}),
    json.dumps(["prompt_id", "c"]),
    json.dumps({"prompt_id": "", "response_tokens": 5}),
    json.dumps({"prompt_id": "c", "response_tokens": True}),
    json.dumps({"prompt_id": "c", "turns": [{"gen_tokens": 3, "tool_latency_s": 0.1, "obs_tokens": 2}]}),
]


def test_trace_keeps_good_lines_and_reports_bad_ones_by_number():
    trace = parse_trace(SINGLE, get_workload("math-7b"))
    assert [(g.prompt_id, [s.response_tokens for s in g.samples]) for g in trace.groups] == [("a", [10, 20]),
                                                                                             ("b", [5])]
    assert trace.groups[0].prompt_tokens == 99  # the first line giving it wins for the group
    assert [n for n, _ in trace.rejected] == [4, 5, 7, 8, 9, 10]
    reasons = dict(trace.rejected)
    assert "not JSON" in reasons[4] and "response_tokens" in reasons[5] and "object" in reasons[7]
    assert "response_tokens" in reasons[10]  # a multi-turn line in a single-turn workload
    assert trace.groups[1].prompt_tokens >= 1  # drawn from the workload, seeded by the id
    assert parse_trace(SINGLE, get_workload("math-7b")).groups == trace.groups


def test_multi_turn_trace_validates_every_turn():
    lines = [
        json.dumps({"prompt_id": "p", "turns": [{"gen_tokens": 5, "tool_latency_s": 0.5, "obs_tokens": 7},
                                                 {"gen_tokens": 3, "tool_latency_s": 0, "obs_tokens": 0}]}),
        json.dumps({"prompt_id": "p", "turns": [{"gen_tokens": 5, "tool_latency_s": -1, "obs_tokens": 7}]}),
        json.dumps({"prompt_id": "p", "turns": []}),
        json.dumps({"prompt_id": "p", "turns": [{"gen_tokens": 5, "obs_tokens": 1}]}),
        json.dumps({"prompt_id": "q", "response_tokens": 4}),
    ]
    trace = parse_trace(lines, get_workload("agentic-search"))
    [group] = trace.groups
    assert [t.gen_tokens for t in group.samples[0].turns] == [5, 3]
    assert group.samples[0].sequence_tokens(group.prompt_tokens) == group.prompt_tokens + 15
    assert [n for n, _ in trace.rejected] == [2, 3, 4, 5]
    assert "tool_latency_s" in dict(trace.rejected)[2]


def test_a_trace_with_nothing_usable_is_an_error():
    with pytest.raises(TraceError, match="line 1"):
        parse_trace(["garbage"], get_workload("math-7b"))


def test_iterations_take_consecutive_groups_and_wrap():
    lines = [json.dumps({"prompt_id": f"p{i}", "response_tokens": i + 1}) for i in range(5)]
    trace = parse_trace(lines, get_workload("math-7b"))
    ids = lambda batch: [g.prompt_id for g in batch]
    assert ids(batch_of(trace, 0, 2)) == ["p0", "p1"]
    assert ids(batch_of(trace, 2, 2)) == ["p4", "p0"]
    assert ids(batch_of(trace, 7, 10)) == [f"p{i}" for i in range(5)]
