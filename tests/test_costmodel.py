NUM_GPUS = 0

import pytest
from hypothesis import given, strategies as st

from dynarl.components import costmodel as cm
from dynarl.components.costmodel import (decode_step_time, get_device, get_model, kv_capacity_tokens,
                                         logprob_time, prefill_time, role_switch_time, train_time,
                                         weight_sync_time)

H100 = get_device("h100-80gb")
Q1, Q7, Q32 = get_model("qwen2.5-1.5b"), get_model("qwen2.5-7b"), get_model("qwen2.5-32b")


# COSTMODEL.md's decode table. Its "4k" / "2k" contexts are 4000 / 2000 tokens: the
# formula gives 13.9 / 19.7 ms with those, 14.04 / 20.02 ms with 4096 / 2048.
@pytest.mark.parametrize("model, tp, batch, context, expected_ms, tokens_per_s_per_gpu", [
    pytest.param(Q7, 1, 1, 0, 8.1, None, id="7b_tp1_b1"),
    pytest.param(Q7, 1, 64, 4000, 13.9, 4.6e3, id="7b_tp1_b64_ctx4k"),
    pytest.param(Q7, 1, 256, 2000, 19.7, 13e3, id="7b_tp1_b256_ctx2k"),
    pytest.param(Q32, 4, 128, 4000, 23.0, 1.4e3, id="32b_tp4_b128_ctx4k"),
])
def test_decode_worked_examples(model, tp, batch, context, expected_ms, tokens_per_s_per_gpu):
    t = decode_step_time(model, H100, batch, context, tp)
    assert t * 1e3 == pytest.approx(expected_ms, rel=0.01)
    if tokens_per_s_per_gpu is not None:
        # the doc rounds throughput to two digits
        assert batch / t / tp == pytest.approx(tokens_per_s_per_gpu, rel=0.03)


def test_decode_with_4096_context_is_what_the_formula_gives():
    # Documents the rounding note above rather than the doc's number.
    assert decode_step_time(Q7, H100, 64, 4096) * 1e3 == pytest.approx(14.04, abs=0.01)


@pytest.mark.parametrize("model, tokens_per_s_per_gpu", [
    pytest.param(Q1, 160e3, id="1.5b"),
    pytest.param(Q7, 32e3, id="7b"),
    pytest.param(Q32, 7.6e3, id="32b"),
])
def test_prefill_rate(model, tokens_per_s_per_gpu):
    assert 10_000 / prefill_time(model, H100, 10_000) == pytest.approx(tokens_per_s_per_gpu, rel=0.02)


# The doc's 1.9k for 32B is the formula's 1.87k rounded up.
@pytest.mark.parametrize("model, tokens_per_s_per_gpu", [
    pytest.param(Q1, 35e3, id="1.5b"),
    pytest.param(Q7, 7.8e3, id="7b"),
    pytest.param(Q32, 1.9e3, id="32b"),
])
def test_training_rate_at_40_percent_mfu_8k(model, tokens_per_s_per_gpu):
    t = train_time(model, H100, num_tokens=1_000_000, mean_seq_len=8192, num_devices=8, mfu=0.4)
    assert 1_000_000 / t / 8 == pytest.approx(tokens_per_s_per_gpu, rel=0.02)


@pytest.mark.parametrize("model, tp, expected_tokens", [
    pytest.param(Q1, 1, 2.3e6, id="1.5b_tp1"),
    pytest.param(Q7, 1, 0.94e6, id="7b_tp1"),
    pytest.param(Q32, 2, 0.28e6, id="32b_tp2"),
    pytest.param(Q32, 4, 0.80e6, id="32b_tp4"),
])
def test_kv_capacity(model, tp, expected_tokens):
    assert kv_capacity_tokens(model, H100, tp) == pytest.approx(expected_tokens, rel=0.015)


@pytest.mark.parametrize("model, kv_bytes, weight_gb", [
    pytest.param(Q1, 28_672, 3.1, id="1.5b"),
    pytest.param(Q7, 57_344, 15.2, id="7b"),
    pytest.param(Q32, 262_144, 65.0, id="32b"),
])
def test_model_shapes(model, kv_bytes, weight_gb):
    assert model.kv_bytes_per_token == kv_bytes
    assert model.weight_bytes / 1e9 == pytest.approx(weight_gb, rel=0.01)
    assert model.hidden_size == model.num_attention_heads * model.head_dim
    assert model.num_non_embedding_params < model.num_params


@pytest.mark.parametrize("bandwidth, expected_s", [
    pytest.param(H100.link_bandwidth, 0.04, id="nvlink"),
    pytest.param(H100.nic_bandwidth, 0.3, id="400g_nic"),
])
def test_weight_sync_floor_7b(bandwidth, expected_s):
    assert weight_sync_time(Q7.weight_bytes, bandwidth) == pytest.approx(expected_s, rel=0.02)


def test_weight_sync_splits_over_parallel_receivers():
    one = weight_sync_time(Q32.weight_bytes, H100.link_bandwidth)
    assert weight_sync_time(Q32.weight_bytes, H100.link_bandwidth, 4) == pytest.approx(one / 4)


def test_logprob_pass_is_three_times_the_training_rate():
    args = (Q7, H100, 123_456, 3000.0, 16)
    assert train_time(*args) / logprob_time(*args) == pytest.approx(3.0)


def test_full_recompute_costs_a_third_more():
    args = (Q7, H100, 100_000, 4096, 8)
    assert train_time(*args, recompute=True) == pytest.approx(train_time(*args) * 4 / 3)


def test_training_time_scales_inversely_with_devices_and_mfu():
    t = train_time(Q7, H100, 1_000_000, 8192, 8, mfu=0.4)
    assert train_time(Q7, H100, 1_000_000, 8192, 16, mfu=0.4) == pytest.approx(t / 2)
    assert train_time(Q7, H100, 1_000_000, 8192, 8, mfu=0.2) == pytest.approx(t * 2)


@pytest.mark.parametrize("model", [Q1, Q7, Q32], ids=lambda m: m.name)
@given(b1=st.integers(1, 1024), b2=st.integers(1, 1024), c1=st.integers(0, 32_000), c2=st.integers(0, 32_000))
def test_decode_monotone_in_batch_and_context(model, b1, b2, c1, c2):
    (b1, b2), (c1, c2) = sorted((b1, b2)), sorted((c1, c2))
    assert decode_step_time(model, H100, b1, c1) <= decode_step_time(model, H100, b2, c1)
    assert decode_step_time(model, H100, b1, c1) <= decode_step_time(model, H100, b1, c2)


@given(n1=st.integers(0, 10**6), n2=st.integers(0, 10**6))
def test_prefill_monotone_and_linear(n1, n2):
    assert prefill_time(Q7, H100, n1 + n2) == pytest.approx(
        prefill_time(Q7, H100, n1) + prefill_time(Q7, H100, n2))


def test_decode_floor_is_the_step_overhead():
    assert decode_step_time(Q1, H100, 0, 0) == 0.0
    assert decode_step_time(Q1, H100, 1, 0) > cm.DECODE_STEP_OVERHEAD_S


@pytest.mark.parametrize("model, batch, context", [
    pytest.param(Q7, 1, 0, id="7b_b1"),
    pytest.param(Q7, 64, 4000, id="7b_b64"),
    pytest.param(Q32, 128, 4000, id="32b_b128"),
])
def test_tp_scaling_is_sublinear(model, batch, context):
    # More TP shortens a step, but T0 and the per-layer all-reduces keep it above t1/TP.
    times = [decode_step_time(model, H100, batch, context, tp) for tp in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True)
    for tp, t in zip((2, 4, 8), times[1:]):
        assert t > times[0] / tp


def test_tp8_batch1_latency_matches_the_limit_section():
    # COSTMODEL.md §4: tau_1 for 7B is ~8 ms at TP1 and ~3.4 ms at TP8.
    assert decode_step_time(Q7, H100, 1, 0, tp=8) * 1e3 == pytest.approx(3.4, rel=0.05)


def test_prefill_scales_exactly_with_tp():
    assert prefill_time(Q32, H100, 8192, tp=4) == pytest.approx(prefill_time(Q32, H100, 8192) / 4)


def test_kv_capacity_grows_with_tp_and_memory():
    caps = [kv_capacity_tokens(Q32, H100, tp) for tp in (1, 2, 4, 8)]
    assert caps == sorted(caps) and caps[0] < caps[1]
    assert kv_capacity_tokens(Q7, H100, mem_util=0.5) < kv_capacity_tokens(Q7, H100)
    assert kv_capacity_tokens(Q7, get_device("h200")) > kv_capacity_tokens(Q7, H100)
    assert kv_capacity_tokens(Q32, get_device("cpu-tiny")) == 0  # weights do not fit


def test_h200_decodes_faster_than_h100():
    h200 = get_device("h200")
    assert decode_step_time(Q7, h200, 64, 4000) < decode_step_time(Q7, H100, 64, 4000)
    assert prefill_time(Q7, h200, 1000) == prefill_time(Q7, H100, 1000)  # same compute


def test_role_switch():
    assert 1.0 <= role_switch_time() <= 3.0
    assert role_switch_time(restart=True) >= role_switch_time() + 10.0


@pytest.mark.parametrize("lookup, name", [
    pytest.param(get_model, "llama-7b", id="model"),
    pytest.param(get_device, "a100", id="device"),
])
def test_unknown_names_are_rejected(lookup, name):
    with pytest.raises(ValueError, match="known"):
        lookup(name)


@pytest.mark.parametrize("model, tp", [pytest.param(Q1, 1, id="1.5b"), pytest.param(Q7, 1, id="7b"),
                                       pytest.param(Q32, 4, id="32b_tp4")])
@given(batch=st.integers(0, 2048), context=st.floats(0, 50_000), steps=st.integers(0, 400),
       device=st.sampled_from(sorted(cm.DEVICES)))
def test_decode_steps_time_is_the_sum_of_single_steps(model, tp, batch, context, steps, device):
    dev = get_device(device)
    expected = sum(decode_step_time(model, dev, batch, context + j, tp) for j in range(steps))
    assert cm.decode_steps_time(model, dev, batch, context, steps, tp) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_decode_steps_time_crosses_from_compute_to_memory_bound():
    # 7B, B=512 from an empty context: compute-bound first, memory-bound after ~830 steps.
    def memory_term(context):
        return (Q7.weight_bytes + 512 * context * Q7.kv_bytes_per_token) / (cm.HBM_EFFICIENCY * H100.hbm_bandwidth)

    assert decode_step_time(Q7, H100, 512, 0) > cm.DECODE_STEP_OVERHEAD_S + memory_term(0)
    assert decode_step_time(Q7, H100, 512, 2999) == pytest.approx(cm.DECODE_STEP_OVERHEAD_S + memory_term(2999))
    expected = sum(decode_step_time(Q7, H100, 512, j) for j in range(3000))
    assert cm.decode_steps_time(Q7, H100, 512, 0, 3000) == pytest.approx(expected, rel=1e-12)
