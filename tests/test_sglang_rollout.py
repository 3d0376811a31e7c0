NUM_GPUS = 0
"""The SGLang rollout adapter against tests/fakes/sglang_engine.py, a fake that keeps
sglang 0.5.23's call signatures and its paused/idle preconditions (sglang cannot run
here: it needs CUDA). What a real engine does on a GPU is not checked by these tests.
This file: the fake's fidelity, generation, abort, pause, export/import."""
import asyncio
import inspect

import pytest

from dynarl.components.rollout.base import InflightRequest
from fakes import sglang_io_struct as fake_io
from fakes.sglang_engine import FakeEngine, FakeTokenizerManager
from fakes.sglang_harness import expected, fake_sglang, make, req, ticks  # noqa: F401  (fixtures)


# ---- the fake itself keeps the real API ---------------------------------------------

@pytest.mark.parametrize("qualname", sorted(fake_io.REAL_SIGNATURES))
def test_fake_keeps_the_real_signatures(qualname):
    cls_name, method = qualname.split(".")
    cls = {"FakeEngine": FakeEngine, "FakeTokenizerManager": FakeTokenizerManager}[cls_name]
    params = [p for p in inspect.signature(getattr(cls, method)).parameters if p != "self"]
    assert tuple(params) == fake_io.REAL_SIGNATURES[qualname]


async def test_fake_rejects_what_sglang_rejects(make):
    eng, tm = make()
    with pytest.raises(TypeError):  # BACKENDS.md's name; 0.5.23 calls it kv_hints
        await eng.engine.async_generate(input_ids=[1, 2], kv_router_hint={})
    with pytest.raises(TypeError):
        await eng.engine.async_generate(input_ids=[1, 2], rid="x", sampling_params={"max_tokens": 3})
    with pytest.raises(TypeError):
        fake_io.PauseGenerationReqInput("retract")  # keyword-only, as msgspec's kw_only structs
    with pytest.raises(RuntimeError, match="already running"):
        eng.engine.flush_cache()  # sync Engine methods break inside a running loop
    assert (await tm.update_weights_from_tensor(
        fake_io.UpdateWeightsFromTensorReqInput(serialized_named_tensors=[b"x"]), None))[0] is False  # no session


# ---- generation -----------------------------------------------------------------------

async def test_generate_returns_ids_logprobs_and_finish_reasons(make):
    eng, tm = make()
    prompts = {"a": [5, 6, 7], "b": [11, 12], "c": [20]}
    stop_b = (expected([11, 12], 8)[0][2],)  # b's third token stops it
    results = await eng.generate([req("a", prompts["a"], 6), req("b", prompts["b"], 8, stop_b), req("c", [20], 1)])
    assert [r.request_id for r in results] == ["a", "b", "c"]
    for r, (name, max_new, stop) in zip(results, [("a", 6, ()), ("b", 8, stop_b), ("c", 1, ())]):
        ids, lps, reason = expected(prompts[name], max_new, stop)
        assert (r.output_token_ids, r.finish_reason) == (ids, reason)
        assert r.output_logprobs == pytest.approx(lps)
        assert r.prompt_token_ids == prompts[name] and r.weight_version == 0
    assert results[1].output_token_ids[-1] == stop_b[0]  # the stop token stays in the response
    assert len({len(rid) for rid in tm.admitted_order}) == 1  # fixed-length rids: prefix match == exact


async def test_step_loop_returns_each_result_once(make):
    eng, _ = make()
    for i in range(5):
        eng.add_request(req(f"r{i}", [3 + i, 4], max_new=3 + i))
    seen = []
    while eng.has_work():
        seen += await eng.step()
    assert sorted(r.request_id for r in seen) == [f"r{i}" for i in range(5)]
    assert not eng.has_work() and await eng.step() == []


async def test_a_waiting_step_wakes_for_any_result_and_for_pause(make):
    eng, _ = make()
    eng.add_request(req("long", [5, 6], 60))
    stepping = asyncio.create_task(eng.step())
    await ticks(2)
    eng.add_request(req("short", [7], 1))  # added after step() began waiting, finishes first
    assert [r.request_id for r in await asyncio.wait_for(stepping, 30)] == ["short"]
    stepping = asyncio.create_task(eng.step())
    await ticks(2)
    await eng.pause()
    assert await asyncio.wait_for(stepping, 30) == [] and not eng.has_work()
    await eng.abort(["long"])


async def test_load_is_active_kv_over_capacity(make):
    eng, tm = make(capacity=64)
    for i in range(3):
        eng.add_request(req(f"r{i}", list(range(3, 13)), max_new=20))  # 10 + 20 tokens each: two fit
    await ticks(8)
    load = await eng.load()
    assert load.kv_capacity_tokens == 64 and load.num_running == 2 and load.num_waiting == 1
    assert load.active_kv_tokens == sum(len(r.input_ids) + len(r.output_ids) for r in tm.running) > 20
    assert load.utilization == load.active_kv_tokens / 64
    await eng.abort(["r0", "r1", "r2"])


async def test_cache_hit_tokens_count_the_reused_prefix(make):
    eng, _ = make()
    first = (await eng.generate([req("a", [5, 6, 7, 8], 4)]))[0]
    second = (await eng.generate([req("b", first.prompt_token_ids + first.output_token_ids + [3], 2)]))[0]
    assert second.cached_tokens == 8
    assert (await eng.load()).cache_hit_tokens == 8


# ---- abort, pause, export / import --------------------------------------------------------

async def test_abort_returns_partial_results_and_others_finish(make):
    eng, _ = make()
    eng.add_request(req("keep", [5, 6], 6))
    eng.add_request(req("drop", [7, 8], 50))
    await ticks(6)
    aborted = await eng.abort(["drop", "unknown"])
    assert [r.request_id for r in aborted] == ["drop"] and aborted[0].finish_reason == "abort"
    assert 0 < len(aborted[0].output_token_ids) < 50
    assert aborted[0].output_token_ids == expected([7, 8], 50)[0][:len(aborted[0].output_token_ids)]
    rest = []
    while eng.has_work():
        rest += await eng.step()
    assert [r.request_id for r in rest] == ["keep"]


async def test_export_then_import_continues_exactly(make):
    """Workload migration: pause A, export, import on B with fewer max_new_tokens: the
    outputs equal an uninterrupted run."""
    a, tm_a = make(stream_interval=3)
    b, tm_b = make()
    prompts = {f"r{i}": [4 + i, 5, 6] for i in range(3)}
    for rid, prompt in prompts.items():
        a.add_request(req(rid, prompt, 12))
    await ticks(10)
    generated = {r.rid: len(r.output_ids) for r in tm_a.running}
    await a.pause()  # retracts: the queued requests' aborts carry what was reported
    items = await a.export_inflight()
    assert sorted(i.request.request_id for i in items) == sorted(prompts)
    exported = sorted(len(i.output_token_ids) for i in items)
    assert exported == sorted(n - n % 3 for n in generated.values()) and 0 < exported[0] < min(generated.values())
    assert not a.has_work() and tm_a.parked_while_paused == 0
    b.import_inflight([InflightRequest.from_wire(i.to_wire()) for i in items])
    await ticks(3)
    sent = {tuple(r.input_ids): r.params["max_new_tokens"] for r in tm_b.received}
    for i in items:
        assert sent[tuple(i.request.prompt_token_ids + i.output_token_ids)] == 12 - len(i.output_token_ids)
    results = []
    while b.has_work():
        results += await b.step()
    for r in results:
        ids, lps, reason = expected(prompts[r.request_id], 12)
        assert (r.output_token_ids, r.finish_reason) == (ids, reason)
        assert r.output_logprobs == pytest.approx(lps)
    await a.resume()


async def test_requests_added_while_paused_wait_at_our_gate(make):
    eng, tm = make()
    await eng.pause()
    eng.add_request(req("late", [5, 6], 4))
    await ticks(5)
    assert tm.in_generate == 0 and not eng.has_work()  # SGLang never saw it
    assert (await eng.load()).num_waiting == 1
    items = await eng.export_inflight()
    assert [(i.request.request_id, i.output_token_ids) for i in items] == [("late", [])]
    assert tm.parked_while_paused == 0
    eng.import_inflight(items)
    await eng.resume()
    results = []
    while eng.has_work():
        results += await eng.step()
    assert results[0].output_token_ids == expected([5, 6], 4)[0]


async def test_request_added_just_before_pause_is_not_stranded(make):
    """add_request and pause() in the same loop step: our gate closes first, so the
    request never waits inside SGLang's TokenizerManager, where abort cannot reach it."""
    eng, tm = make()
    eng.add_request(req("r", [5, 6], 4))
    await eng.pause()
    await ticks(5)
    items = await asyncio.wait_for(eng.export_inflight(), timeout=30)  # a stranded request never returns
    assert [i.request.request_id for i in items] == ["r"] and tm.parked_while_paused == 0


async def test_generate_caller_gets_the_partial_result_of_an_exported_request(make):
    eng, _ = make()
    task = asyncio.create_task(eng.generate([req("g", [5, 6], 40)]))
    await ticks(8)
    items = await eng.export_inflight()
    result = (await task)[0]
    assert result.finish_reason == "abort" and result.output_token_ids == items[0].output_token_ids


async def test_import_of_a_complete_request_finishes_without_sglang(make):
    eng, tm = make()
    done = InflightRequest(req("full", [5], 2), [7, 8], [-0.1, -0.2])
    eng.import_inflight([done])
    assert [(r.request_id, r.finish_reason, r.output_token_ids) for r in await eng.step()] == [("full", "length", [7, 8])]
    assert tm.admitted_order == []


# ---- what the real engine showed (tests/test_sglang_real_engine.py) -------------------

async def test_a_stop_on_the_models_eos_that_is_not_listed_is_continued(make, monkeypatch):
    """SGLang stops on the model's EOS as well as the listed ids once ignore_eos is off
    (ignore_eos skips the listed ids too); dynarl stops only on the listed ones."""
    from fakes import sglang_engine

    real = sglang_engine.next_token
    before_eos = [5, 6, 7] + expected([5, 6, 7], 3)[0]

    def with_eos(seq):  # the 4th token of the continuation of [5, 6, 7] is the EOS
        return (sglang_engine.EOS, -0.5) if seq == before_eos else real(seq)

    uninterrupted = [5, 6, 7]
    while len(uninterrupted) < 13:
        uninterrupted.append(with_eos(uninterrupted)[0])
    monkeypatch.setattr(sglang_engine, "next_token", with_eos)
    eng, tm = make()
    unlisted = next(t for t in range(127, 3, -1) if t not in uninterrupted)
    [result] = await eng.generate([req("a", [5, 6, 7], 10, stop=(unlisted,))])
    assert result.output_token_ids == uninterrupted[3:] and result.finish_reason == "length"
    assert result.output_token_ids[3] == sglang_engine.EOS and len(result.output_logprobs) == 10
    assert len(tm.received) == 2 and tm.received[0].params["ignore_eos"] is False


async def test_load_while_paused_counts_the_retracted_requests_as_waiting(make):
    """SGLang publishes no load snapshot while paused: the adapter reports what the
    retract did (every request queued, its KV freed), not the snapshot from before."""
    eng, tm = make()
    for i in range(2):
        eng.add_request(req(f"r{i}", [5, 6, 7], 40))
    await ticks(8)
    assert (await eng.load()).num_running == 2
    await eng.pause()
    eng.add_request(req("late", [5, 6], 4))
    load = await eng.load()
    assert (tm._snapshot.num_running_reqs, load.num_running, load.num_waiting, load.active_kv_tokens) == (2, 0, 3, 0)
    await eng.resume()
    await eng.abort(["r0", "r1", "late"])
