"""Workload migration between two real SGLang 0.5.23 engines on the CPU, through the
adapter: requests exported mid-generation from one engine and imported into another
continue with their tokens, nothing lost or duplicated (greedy, so the whole output is
checked against transformers' uninterrupted run). Run by .ci/engine_sglang."""
NUM_GPUS = 0

import pytest
import pytest_asyncio

import sglang_real as H

pytestmark = [pytest.mark.real_engine, pytest.mark.asyncio(loop_scope="module")]
PROMPTS = {"m0": [5, 6, 7], "m1": [9, 10, 11, 12], "m2": [20, 21]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return H.hf_folder(tmp_path_factory.mktemp("qwen2"), seed=0)


@pytest.fixture(scope="module")
def reference(folder):
    return H.random_model(0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(folder):
    a, a_procs = H.start(H.engine_config(folder))
    try:
        b, b_procs = H.start(H.engine_config(folder))
        try:
            print(f"two engines: {H.tree_rss_gb():.2f} GB RSS in this process tree")
            yield a, b
        finally:
            H.shutdown(b, b_procs)
    finally:
        H.shutdown(a, a_procs)


async def _drain(engine, n):
    done = {}
    while len(done) < n:
        done.update({r.request_id: r for r in await engine.step()})
    return done


async def _move(a, b, reference, max_new, pause_first):
    for rid, prompt in PROMPTS.items():
        a.add_request(H.req(rid, prompt, max_new))
    # past SGLang's first report of a non-streaming request (50 tokens): they decode in
    # one batch, so each has made about a third of the KV's output tokens
    prompts = sum(len(p) for p in PROMPTS.values())
    await H.until_kv_tokens(a, prompts + len(PROMPTS) * 60)
    if pause_first:
        await a.pause()  # what the runtime's Workload migration does first (RunControl.pause)
    items = await a.export_inflight()
    if pause_first:
        await a.resume()
    assert sorted(i.request.request_id for i in items) == sorted(PROMPTS) and not a.has_work()
    full = {rid: H.greedy(reference, prompt, max_new) for rid, prompt in PROMPTS.items()}
    for item in items:
        n = len(item.output_token_ids)
        assert n < max_new and len(item.output_logprobs) == n
        assert item.output_token_ids == full[item.request.request_id][0][:n]  # the tokens so far, exactly
    b.import_inflight(items)
    done = await _drain(b, len(items))
    for rid, result in done.items():
        assert result.finish_reason == "length"
        assert result.output_token_ids == full[rid][0]  # nothing lost or duplicated
        assert result.output_logprobs == pytest.approx(full[rid][1], abs=1e-3)
    assert await a.step() == []  # the exported requests are no results of the first engine
    return items


async def test_requests_exported_mid_generation_continue_on_another_engine(engines, reference):
    a, b = engines
    items = await _move(a, b, reference, 300, pause_first=False)
    assert all(len(i.output_token_ids) > 0 for i in items)  # running requests' aborts carry all their tokens


async def test_export_after_a_retract_pause_keeps_the_reported_tokens(engines, reference):
    """The runtime pauses (mode "retract": the requests go back to SGLang's queue) and
    then exports. SGLang answers the abort of a queued request with the tokens its
    TokenizerManager has (reported every SGLANG_FORCE_STREAM_INTERVAL = 50 tokens):
    the exported prefix is a multiple of 50, and the importer regenerates the rest."""
    a, b = engines
    items = await _move(a, b, reference, 300, pause_first=True)
    assert all(len(i.output_token_ids) % 50 == 0 for i in items)
    assert all(len(i.output_token_ids) >= 50 for i in items), [len(i.output_token_ids) for i in items]
