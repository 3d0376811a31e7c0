NUM_GPUS = 0

import asyncio

import pytest

from dynarl.components import costmodel as cm
from dynarl.components.inference.emulated import EmulatedInference, EmulatedInferenceConfig
from dynarl.components.trainer.emulated.layout import synced_weight_bytes
from dynarl.core.virtual_time import run_virtual

M7, H100 = cm.get_model("qwen2.5-7b"), cm.get_device("h100-80gb")


def sequences(lengths):
    return [[(i * 13 + j) % 1000 for j in range(n)] for i, n in enumerate(lengths)]


@pytest.mark.parametrize("lengths, num_devices", [
    pytest.param([1000] * 16, 1, id="uniform_1dev"),
    pytest.param([50, 5000, 20_000], 4, id="ragged_4dev"),
])
def test_log_prob_pass_takes_the_cost_model_time(lengths, num_devices):
    async def main():
        inf = EmulatedInference(EmulatedInferenceConfig(num_devices=num_devices))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await inf.compute_logprobs(sequences(lengths), [10] * len(lengths))
        return out, loop.time() - t0

    out, elapsed = run_virtual(main())
    tokens = sum(lengths)
    mean_len = sum(n * n for n in lengths) / tokens
    assert elapsed == pytest.approx(cm.logprob_time(M7, H100, tokens, mean_len, num_devices), rel=1e-9)
    assert elapsed == pytest.approx(cm.train_time(M7, H100, tokens, mean_len, num_devices) / 3, rel=1e-9)
    assert [len(row) for row in out] == [n - 10 for n in lengths]
    assert all(-4.0 < v <= 0.0 for row in out for v in row)


def test_values_are_deterministic_and_follow_the_weights():
    async def main():
        inf = EmulatedInference()
        seqs = sequences([40, 60])
        a = await inf.compute_logprobs(seqs, [5, 5])
        b = await inf.compute_logprobs(seqs, [5, 5])
        await inf.update_weights(None, version=1)
        t0 = asyncio.get_running_loop().time()
        c = await inf.compute_logprobs(seqs, [5, 5])
        return a, b, c, asyncio.get_running_loop().time() - t0, inf.forward_time([40, 60])

    a, b, c, elapsed, forward = run_virtual(main())
    assert a == b and a != c
    # the whole model (as the emulated trainer sends it) arrived over NVLink before the pass
    assert elapsed == pytest.approx(forward + synced_weight_bytes(M7) / H100.link_bandwidth, rel=1e-9)


@pytest.mark.parametrize("ids, prompt_lens, match", [
    pytest.param([[1, 2, 3]], [1, 1], "prompt lengths", id="count_mismatch"),
    pytest.param([[1, 2, 3]], [4], "prompt_lens", id="prompt_too_long"),
])
def test_rejects_malformed_batches(ids, prompt_lens, match):
    with pytest.raises(ValueError, match=match):
        run_virtual(EmulatedInference().compute_logprobs(ids, prompt_lens))
