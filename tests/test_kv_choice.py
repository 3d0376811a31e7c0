"""The per-request choice between moving a request's KV and prefilling it again
(components/rollout/kv_choice.py): a pure decision and its online link fit."""
import pytest

from dynarl.components.rollout.kv_choice import KVCost, KVLinkFit, choose


@pytest.mark.parametrize("tokens, move, prefill, expected", [
    (0, KVCost(0.0, 1e-6), 1e-3, False),          # nothing to move
    (100, None, 1e-3, True),                     # link not known yet: move (and measure it)
    (100, KVCost(0.0, 1e-6), 0.0, True),          # prefill not known: move
    (100, KVCost(0.0, 1e-6), 1e-3, True),         # per token 1000x cheaper
    (100, KVCost(0.0, 2e-3), 1e-3, False),        # slower link than prefill
    (10, KVCost(5e-3, 1e-6), 1e-4, False),        # small request: the fixed cost dominates (5 ms vs 1 ms)
    (1000, KVCost(5e-3, 1e-6), 1e-4, True),       # large one: 6 ms vs 100 ms
    (50, KVCost(0.0, 1e-3), 1e-3, True),          # equal: move
])
def test_choose(tokens, move, prefill, expected):
    assert choose(tokens, move, prefill) is expected


def test_an_empty_fit_knows_nothing():
    assert KVLinkFit().cost() is None


def test_the_fit_recovers_latency_and_per_token_cost():
    fit = KVLinkFit()
    for tokens in (16, 64, 256, 1024):
        fit.add(tokens, 2e-3 + tokens * 5e-6)
    cost = fit.cost()
    assert cost.latency_s == pytest.approx(2e-3) and cost.per_token_s == pytest.approx(5e-6)
    assert cost.seconds(100) == pytest.approx(2e-3 + 5e-4)


@pytest.mark.parametrize("points, latency, per_token", [
    ([(100, 1.0)], 0.0, 0.01),                   # one size: all of it per token
    ([(100, 1.0), (100, 3.0)], 0.0, 0.02),       # one size, twice: the mean
    ([(10, 2.0), (1000, 1.0)], 1.5, 0.0),        # bigger was cheaper (noise): all fixed cost, the mean
    ([(10, 0.0), (20, 1.0), (30, 2.0)], 0.0, 2.0 * 30 / 1400 + 1.0 * 20 / 1400),  # negative intercept: through 0
])
def test_the_fit_keeps_both_terms_non_negative(points, latency, per_token):
    fit = KVLinkFit()
    for x, y in points:
        fit.add(x, y)
    cost = fit.cost()
    assert cost.latency_s == pytest.approx(latency) and cost.per_token_s == pytest.approx(per_token)
    assert cost.latency_s >= 0 and cost.per_token_s >= 0
