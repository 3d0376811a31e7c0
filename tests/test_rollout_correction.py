NUM_GPUS = 0
"""The rollout-trainer log-prob mismatch (components/inference/gap.py) and the loss's
correction for it (algorithm.rollout_correction: trainer/native/rollout_correction.py):
the arithmetic against references written here from the formulas, every objective's
loss weighed by the corrected weights, the config, the step's metrics, and a short
`dynarl train` run reporting the gap of the native engine."""

import json
import math
import os
from types import SimpleNamespace

import pytest
import torch

from dynarl import ConfigError
from dynarl.components.inference.gap import LogprobGap, logprob_gap, mismatch_metrics, teacher_metrics
from dynarl.components.trainer.native import losses, objectives
from dynarl.components.trainer.native.rollout_correction import correct, rollout_weights
from dynarl.components.workflows.config import load_config
from dynarl.components.workflows.grpo import GRPO
from dynarl.launch.trackers import scalars
from grpo_tiny import overrides

INF = float("inf")


# ---- the gap ---------------------------------------------------------------------------

def ref_gap(p, q, mask):
    """d = q - p over mask-1 tokens with a finite d: (tokens, sum d, sum |d|, max |d|,
    sum exp(d) - d - 1, not finite)."""
    ds = [b - a for a, b, m in zip(p, q, mask or [1] * len(p)) if m]
    ok = [d for d in ds if math.isfinite(d)]
    return (len(ok), sum(ok), sum(abs(d) for d in ok), max((abs(d) for d in ok), default=0.0),
            sum(math.exp(d) - d - 1 for d in ok), len(ds) - len(ok))


@pytest.mark.parametrize("p, q, mask", [
    pytest.param([-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5], None, id="equal"),
    pytest.param([-1.0, -2.0, -0.5], [-1.1, -1.7, -0.5], None, id="both-ways"),
    pytest.param([-1.0, -2.0, -0.5, -3.0], [-1.1, -9.0, -0.4, -3.0], [1, 0, 1, 1], id="masked-token-left-out"),
    pytest.param([-1.0, -INF, -0.5], [-1.2, -2.0, -0.5], None, id="rollout-minus-inf"),
    pytest.param([-1.0, -0.5], [-1.0, -INF], None, id="trainer-minus-inf"),
    pytest.param([-1.0, -0.5], [-1.0, -0.5], [0, 0], id="no-loss-token"),
])
def test_the_gap_of_a_sample_is_the_formulas(p, q, mask):
    got = logprob_gap(p, q, mask)
    n, diff, absolute, largest, k3, nonfinite = ref_gap(p, q, mask)
    assert (got.tokens, got.nonfinite, got.sequences) == (n, nonfinite, 1 if n else 0)
    assert (got.diff_sum, got.abs_sum, got.abs_max, got.k3_sum) == pytest.approx((diff, absolute, largest, k3))
    assert got.k3_sum >= 0


def test_a_gap_refuses_lists_of_other_tokens():
    with pytest.raises(ValueError, match="not the same tokens"):
        logprob_gap([-1.0, -2.0], [-1.0])
    with pytest.raises(ValueError, match="mask of 1"):
        logprob_gap([-1.0, -2.0], [-1.0, -2.0], [1])


def test_gaps_merge_by_sums_and_the_largest():
    a, b = logprob_gap([-1.0, -2.0], [-1.5, -2.0]), logprob_gap([-1.0, -INF], [-0.2, -1.0])
    merged = LogprobGap.merge([a, None, b, LogprobGap()])
    assert (merged.tokens, merged.sequences, merged.nonfinite) == (3, 2, 1)
    assert merged.diff_sum == pytest.approx(-0.5 + 0.0 + 0.8)
    assert merged.abs_max == pytest.approx(0.8)
    assert LogprobGap.merge([]) == LogprobGap()


def test_the_step_metrics_are_ratios_of_the_sums():
    # rollout p, trainer q: two sequences, d = (+0.1, -0.3) and (+0.2)
    gap = LogprobGap.merge([logprob_gap([-1.0, -2.0], [-0.9, -2.3]), logprob_gap([-1.0], [-0.8])])
    m = mismatch_metrics(gap, "vllm")["mismatch"]
    assert m["backend"] == "vllm" and m["tokens"] == 3
    assert m["mean"] == pytest.approx((0.1 - 0.3 + 0.2) / 3)  # mean of old - rollout
    assert m["abs_mean"] == pytest.approx(0.6 / 3)
    assert m["abs_max"] == pytest.approx(0.3)
    assert m["kl"] == pytest.approx(-m["mean"])               # k1 of KL(rollout || old) per token
    assert m["kl_seq"] == pytest.approx(-((0.1 - 0.3) + 0.2) / 2)  # per sequence: -sum_t d, averaged
    want_k3 = sum(math.exp(d) - d - 1 for d in (0.1, -0.3, 0.2)) / 3
    assert m["k3"] == pytest.approx(want_k3)
    assert mismatch_metrics(None, "native") == {} == mismatch_metrics(LogprobGap(), "native")
    assert teacher_metrics(gap)["teacher"]["kl"] == pytest.approx(m["kl"])


# ---- the weights -------------------------------------------------------------------------

def ref_weight(old, rollout, mode, cap):
    """(weight, capped): tis min(w, C), mis w or 0 above C; a non-finite w is 0, capped."""
    try:
        w = math.exp(old - rollout)
    except OverflowError:
        w = INF
    if not math.isfinite(w):
        return 0.0, True
    if mode == "tis":
        return min(w, cap), w > cap
    return (0.0, True) if w > cap else (w, False)


GAPS = [0.0, 0.3, -0.4, 0.9, 2.0, -3.0]  # old - rollout: w = 1, 1.35, 0.67, 2.46, 7.4, 0.05


@pytest.mark.parametrize("mode", ["tis", "mis"])
@pytest.mark.parametrize("cap", [1.0, 2.0, 5.0])
def test_rollout_weights_are_the_formulas(mode, cap):
    rollout = [-1.0 - 0.1 * k for k in range(len(GAPS))] + [-INF, -1.0]
    old = [r + g for r, g in zip(rollout, GAPS)] + [-1.0, float("nan")]
    weight, capped = rollout_weights(torch.tensor(old, dtype=torch.float64), torch.tensor(rollout, dtype=torch.float64),
                                     mode, cap)
    want = [ref_weight(o, r, mode, cap) for o, r in zip(old, rollout)]
    assert weight.tolist() == pytest.approx([w for w, _ in want])
    assert capped.tolist() == [c for _, c in want]


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="tis or mis"):
        rollout_weights(torch.zeros(1), torch.zeros(1), "seq", 2.0)


def test_none_with_rollout_logprobs_is_decoupled_ppos_cap_bit_for_bit():
    pg, clipped = torch.tensor([0.5, -1.0, 2.0, 0.1]), torch.tensor([True, False, True, False])
    old, behav = torch.tensor([-1.0, -1.0, -1.0, -1.0]), torch.tensor([-1.5, -3.0, -0.2, -INF])
    got, got_clipped, capped = correct(pg, clipped, old, behav, "none", 2.0, 5.0)
    weight = torch.exp(old - behav)
    kept = (weight <= 5.0) & torch.isfinite(weight)
    assert torch.equal(got, pg * torch.where(kept, weight, torch.zeros_like(weight)))  # losses.py's, before
    assert torch.equal(got_clipped, clipped & kept)
    assert capped.tolist() == [False, True, False, True]


def test_without_rollout_logprobs_nothing_is_weighed():
    pg, clipped = torch.tensor([0.5, -1.0]), torch.tensor([True, False])
    got, got_clipped, capped = correct(pg, clipped, torch.zeros(2), None, "tis", 2.0, 5.0)
    assert got is pg and got_clipped is clipped and not capped.any()


# ---- every objective's loss --------------------------------------------------------------

def t(values):
    return torch.tensor(values, dtype=torch.float32)


LOGP = [-1.0, -2.0, -0.5, -1.5, -0.8, -1.2]
OLD = [-1.5, -1.5, -0.55, -1.0, -0.8, -1.25]
ADV = [1.0, -1.0, 0.5, 2.0, -0.7, 0.3]
ROLLOUT = [o - g for o, g in zip(OLD, [0.0, 1.2, -0.4, 0.3, 0.8, 3.0])]  # w = 1, 3.3, 0.67, 1.35, 2.2, 20
MASK = [1, 1, 0, 1, 1, 1]
SEQ = [0, 0, 0, 1, 1, 2]


def ref_ppo(logp, old, a, lo, hi):
    ratio = math.exp(logp - old)
    return -min(ratio * a, min(max(ratio, 1 - lo), 1 + hi) * a)


def ref_cispo(logp, old, a, lo, hi):
    return -min(max(math.exp(logp - old), 1 - lo), 1 + hi) * a * logp


def ref_gspo_tokens(logp, old, a, mask, seq, lo, hi):
    """Each token's share of its sequence's clipped sequence-ratio loss: loss_i / |y_i|."""
    out = []
    for k, s in enumerate(seq):
        toks = [j for j in range(len(seq)) if seq[j] == s and mask[j]]
        ratio = math.exp(sum(logp[j] - old[j] for j in toks) / len(toks))
        A = a[seq.index(s)]
        out.append(-min(ratio * A, min(max(ratio, 1 - lo), 1 + hi) * A) / len(toks))
    return out


def ref_loss(name, mode, cap, lo, hi, samples, max_len):
    """pg_loss and rollout_capped_frac of `name` with each token's term times its weight."""
    if name == "gspo":
        terms = ref_gspo_tokens(LOGP, OLD, ADV, MASK, SEQ, lo, hi)
    elif name == "cispo":
        terms = [ref_cispo(*x, lo, hi) for x in zip(LOGP, OLD, ADV)]
    else:
        terms = [ref_ppo(*x, lo, hi) for x in zip(LOGP, OLD, ADV)]
    weights = [ref_weight(o, r, mode, cap) for o, r in zip(OLD, ROLLOUT)]
    total = sum(term * w for term, (w, _), m in zip(terms, weights, MASK) if m)
    denominator = {"dr_grpo": samples * max_len, "gspo": samples}.get(name, sum(MASK))
    return total / denominator, sum(c for (_, c), m in zip(weights, MASK) if m) / sum(MASK)


OBJECTIVE_NAMES = ["grpo", "dapo", "rloo", "opd", "reinforce_pp", "dr_grpo", "gspo", "cispo"]


@pytest.mark.parametrize("name", OBJECTIVE_NAMES)
@pytest.mark.parametrize("mode, cap", [("tis", 2.0), ("mis", 2.0), ("tis", 1.5), ("mis", 5.0)])
def test_every_objective_weighs_its_tokens_by_the_corrected_weight(name, mode, cap):
    lo, hi = {"gspo": (3e-4, 4e-4), "cispo": (1.0, 0.28)}.get(name, (0.2, 0.28))
    samples, max_len = 3, 8
    got = objectives.objective_loss(name, t(LOGP), t(OLD), t(ADV), t(MASK), clip_eps_low=lo, clip_eps_high=hi,
                                    num_tokens=sum(MASK), num_samples=samples, max_response_len=max_len,
                                    sample_index=torch.tensor(SEQ), behav_logprobs=t(ROLLOUT),
                                    rollout_correction=mode, rollout_correction_cap=cap)
    want, capped = ref_loss(name, mode, cap, lo, hi, samples, max_len)
    assert got.pg_loss.item() == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert got.rollout_capped_frac.item() == pytest.approx(capped)
    assert capped > 0  # (the table has weights above every cap)


@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_grpos_own_loss_takes_the_correction_as_the_objectives_do(mode):
    kwargs = dict(clip_eps_low=0.2, clip_eps_high=0.28, num_tokens=5, behav_logprobs=t(ROLLOUT),
                  rollout_correction=mode, rollout_correction_cap=2.0)
    got = losses.grpo_loss(t(LOGP), t(OLD), t(ADV), t(MASK), **kwargs)
    via = objectives.objective_loss("grpo", t(LOGP), t(OLD), t(ADV), t(MASK), **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(got, via))


def test_the_gradient_of_a_truncated_token_is_the_capped_weight_times_ppos():
    """d pg_t / d logp_t = -w_t r_t A_t / N for an unclipped token, w_t = min(w, C)."""
    logp, old, rollout, a = [-1.0, -1.0], [-1.02, -0.98], [-1.02 - 2.0, -0.98 + 0.1], [1.0, -1.0]
    x = t(logp).requires_grad_(True)
    got = losses.grpo_loss(x, t(old), t(a), t([1, 1]), clip_eps_low=0.2, clip_eps_high=0.2, num_tokens=2,
                           behav_logprobs=t(rollout), rollout_correction="tis", rollout_correction_cap=2.0)
    got.pg_loss.backward()
    want = [-min(math.exp(o - r), 2.0) * math.exp(lp - o) * A / 2 for lp, o, r, A in zip(logp, old, rollout, a)]
    assert x.grad.tolist() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_gspo_and_cispo_still_refuse_a_stale_behaviour_policy(name):
    with pytest.raises(ValueError, match="behav_logprobs"):
        objectives.objective_loss(name, t(LOGP), t(OLD), t(ADV), t(MASK), clip_eps_low=0.2, clip_eps_high=0.2,
                                  num_tokens=5, num_samples=3, sample_index=torch.tensor(SEQ),
                                  behav_logprobs=t(ROLLOUT))


# ---- the config ----------------------------------------------------------------------------

@pytest.mark.parametrize("extra, mode, cap", [
    pytest.param([], "none", 2.0, id="default-none"),
    pytest.param([("algorithm.rollout_correction", "tis")], "tis", 2.0, id="tis"),
    pytest.param([("algorithm.rollout_correction", "mis"), ("algorithm.rollout_correction_cap", 3.0)], "mis", 3.0,
                 id="mis-cap"),
    pytest.param([("algorithm.rollout_correction", "tis"), ("trainer.backend", "megatron")], "tis", 2.0,
                 id="megatron-shares-the-loss"),
])
def test_the_correction_goes_into_the_trainer_engine(extra, mode, cap):
    engine = load_config(None, extra).trainer.engine
    assert (engine.rollout_correction, engine.rollout_correction_cap) == (mode, cap)


@pytest.mark.parametrize("extra, path, fragment", [
    pytest.param([("algorithm.rollout_correction", "seq")], "algorithm.rollout_correction", "choose from",
                 id="unknown"),
    pytest.param([("algorithm.rollout_correction_cap", 0.5)], "algorithm", "must be >= 1", id="cap-below-one"),
    pytest.param([("algorithm.rollout_correction", "tis"), ("rollout.temperature", 0.7)],
                 "algorithm.rollout_correction", "set rollout.temperature 1", id="temperature"),
    pytest.param([("algorithm.rollout_correction", "mis"), ("workflow", "embodied")], "algorithm.rollout_correction",
                 "embodied", id="embodied"),
])
def test_correction_config_errors_name_the_field(extra, path, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, extra)
    assert info.value.path.startswith(path)
    assert fragment in str(info.value)


@pytest.mark.parametrize("source, correction, expected", [
    (False, "none", False), (False, "tis", True), (False, "mis", True), (True, "none", True),
])
def test_batches_carry_the_rollouts_logprobs_when_corrected(source, correction, expected):
    """GRPO.behaviour: the batch source's (an older policy made them) or the correction's."""
    cfg = load_config(None, [("algorithm.rollout_correction", correction)])
    host = SimpleNamespace(batches=SimpleNamespace(behaviour=source), cfg=cfg)
    assert GRPO.behaviour.fget(host) is expected


# ---- the step's metrics --------------------------------------------------------------------

def test_the_step_row_has_the_gap_tagged_with_the_backend_and_trackers_get_its_numbers():
    from dynarl.components.experience import Trained
    from dynarl.components.stage_results import InferenceStats, RewardStats, RolloutStats
    from dynarl.components.trainer.metrics import TrainMetrics
    from dynarl.components.workflows.step_metrics import step_metrics

    trained = Trained(ids=["a", "b"], digests=[1, 2], rewards=[1.0, 0.0], lengths=[2, 1], finishes=["stop"] * 2,
                      versions=[0, 0])
    ranks = [InferenceStats(samples=1, tokens=4, busy=[], rollout_gap=logprob_gap([-1.0, -2.0], [-0.9, -2.3])),
             InferenceStats(samples=1, tokens=3, busy=[], rollout_gap=logprob_gap([-1.0], [-0.8]))]
    row = step_metrics(0, trained, TrainMetrics(loss=0.1, grad_norm=1.0, tokens=3, step=1, rollout_capped_frac=0.25),
                       [RolloutStats(tokens=3)], [RewardStats(verifier="v")], {}, 1.0, inference_stats=ranks,
                       rollout_backend="vllm")
    assert row["rollout_capped_frac"] == 0.25
    assert row["mismatch"]["backend"] == "vllm" and row["mismatch"]["tokens"] == 3
    assert row["mismatch"]["abs_max"] == pytest.approx(0.3)
    assert "teacher" not in row
    flat = scalars(row)
    assert flat["mismatch/abs_mean"] == pytest.approx(0.2) and "mismatch/backend" not in flat
    json.dumps(row)  # (a metrics.jsonl line)


# ---- a run -----------------------------------------------------------------------------------

def test_a_native_run_reports_the_gap_and_corrects_for_it(tmp_path):
    """Two steps of `dynarl train` with rollout_correction mis: every step's row has the
    native engine's gap over its loss tokens (float32 on both sides: small), and the
    fraction of tokens the cap dropped."""
    from dynarl.launch.train import prepare

    run_dir = str(tmp_path / "run")
    job = prepare(None, overrides("run.steps=2", "algorithm.rollout_correction=mis"), run_dir, None)
    assert job.run() == 0
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert len(rows) == 2
    for r in rows:
        m = r["mismatch"]
        assert m["backend"] == "native" and m["tokens"] > 0 and m["nonfinite"] == 0
        assert all(math.isfinite(m[k]) for k in ("abs_mean", "abs_max", "mean", "kl", "kl_seq", "k3"))
        assert 0 <= m["abs_mean"] <= m["abs_max"] < 0.1
        assert r["rollout_capped_frac"] == 0.0  # nothing near a weight of 2 between two float32 engines
