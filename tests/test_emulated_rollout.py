NUM_GPUS = 0

import asyncio
import inspect
import random

import pytest
from hypothesis import given, settings, strategies as st

from dynarl.components import costmodel as cm
from dynarl.components.rollout.base import (GenerationRequest, InflightRequest, RolloutEngine,
                                            SamplingParams)
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.components.rollout.emulated.tokens import response_tokens
from dynarl.core.virtual_time import run_virtual

M7, H100 = cm.get_model("qwen2.5-7b"), cm.get_device("h100-80gb")


def request(rid, prompt, n, seed=None, **kw):
    return GenerationRequest(rid, list(prompt), SamplingParams(max_new_tokens=n, seed=seed), **kw)


def prompt_of(length, salt=0):
    return [(salt * 7919 + i * 31) % 50_000 for i in range(length)]


def engine(**kw):
    return EmulatedRolloutEngine(EmulatedRolloutConfig(**kw))


async def drive(eng, on_step=None):
    """Step until idle; returns {request_id: (result, loop time it came back)}."""
    loop, done = asyncio.get_running_loop(), {}
    while eng.has_work():
        for r in await eng.step():
            done[r.request_id] = (r, loop.time())
        if on_step:
            on_step(eng)
    return done


def alone_time(prompt_len, n, model=M7, device=H100, tp=1):
    return cm.prefill_time(model, device, prompt_len, tp) + sum(
        cm.decode_step_time(model, device, 1, prompt_len + k, tp) for k in range(n))


def test_matches_the_rollout_engine_protocol():
    for name, member in inspect.getmembers(RolloutEngine, inspect.isfunction):
        if name.startswith("_"):
            continue
        ours = getattr(EmulatedRolloutEngine, name)
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(member), name
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(member).parameters), name
    assert engine().weight_version == 0


@pytest.mark.parametrize("prompt_len, n, tp, model", [
    pytest.param(100, 50, 1, "qwen2.5-7b", id="7b_short"),
    pytest.param(3000, 400, 1, "qwen2.5-1.5b", id="1.5b_long"),
    pytest.param(500, 20, 4, "qwen2.5-32b", id="32b_tp4"),
])
def test_one_request_alone_costs_prefill_plus_n_decode_steps(prompt_len, n, tp, model):
    async def main():
        eng = engine(model=model, tp=tp)
        t0 = asyncio.get_running_loop().time()
        [result] = await eng.generate([request("a", prompt_of(prompt_len), n)])
        return result, asyncio.get_running_loop().time() - t0, eng

    result, elapsed, eng = run_virtual(main())
    expected = alone_time(prompt_len, n, cm.get_model(model), H100, tp)
    assert elapsed == pytest.approx(expected, rel=1e-9)
    assert eng.busy_time == pytest.approx(expected, rel=1e-9)
    assert len(result.output_token_ids) == len(result.output_logprobs) == n
    assert result.finish_reason == "length" and result.cached_tokens == 0


def test_two_requests_share_decode_steps_then_the_long_one_runs_alone():
    pa, pb, na, nb = 200, 300, 10, 30

    async def main():
        eng = engine(enable_prefix_cache=False)
        eng.add_request(request("a", prompt_of(pa, 1), na))
        eng.add_request(request("b", prompt_of(pb, 2), nb))
        return await drive(eng)

    done = run_virtual(main())
    shared = cm.prefill_time(M7, H100, pa + pb) + sum(
        cm.decode_step_time(M7, H100, 2, (pa + pb + 2 * k) / 2) for k in range(na))
    tail = sum(cm.decode_step_time(M7, H100, 1, pb + k) for k in range(na, nb))
    assert done["a"][1] == pytest.approx(shared, rel=1e-9)
    assert done["b"][1] == pytest.approx(shared + tail, rel=1e-9)


def flood(seed, num=60):
    rng = random.Random(seed)
    return [request(f"r{i}", prompt_of(rng.randint(1, 120), rng.randint(0, 3)), rng.randint(1, 80), seed=i)
            for i in range(num)]


@pytest.mark.parametrize("coalesce", [False, True], ids=["stepwise", "coalesced"])
@pytest.mark.parametrize("seed, capacity, block_size, max_num_seqs", [
    pytest.param(0, 400, 16, 64, id="tight"),
    pytest.param(1, 250, 8, 1024, id="very_tight_small_blocks"),
    pytest.param(2, 2000, 16, 8, id="seq_limited"),
])
def test_capacity_is_never_exceeded_under_a_flood(seed, capacity, block_size, max_num_seqs, coalesce):
    """Scheduler bookkeeping checked after each schedule() (room for the step's tokens) and
    each step; preempted requests still end with the ids of an unconstrained run."""
    reqs = flood(seed)
    peaks = []

    async def main(**kw):
        eng = engine(**kw)
        sched = eng.scheduler
        schedule = sched.schedule

        def checked_schedule():
            prefill = schedule()
            assert sched.used_tokens() + len(sched.running) <= eng.capacity
            assert len(sched.running) <= eng.config.max_num_seqs
            return prefill

        sched.schedule = checked_schedule

        def check(e):
            load = e.load_now()
            assert e.scheduler.used_tokens() <= e.capacity
            assert load.active_kv_tokens <= load.kv_capacity_tokens
            peaks.append(load.utilization)

        for r in reqs:
            eng.add_request(r)
        return await drive(eng, check), eng

    done, eng = run_virtual(main(kv_capacity_tokens=capacity, block_size=block_size, max_num_seqs=max_num_seqs,
                                 coalesce_steps=coalesce))
    free, _ = run_virtual(main(kv_capacity_tokens=10**6, block_size=block_size))
    assert set(done) == {r.request_id for r in reqs}
    for r in reqs:
        got = done[r.request_id][0]
        assert got.output_token_ids == free[r.request_id][0].output_token_ids
        assert len(got.output_token_ids) == r.sampling.max_new_tokens
    if capacity < 1000:
        assert eng.scheduler.num_preemptions > 0  # the flood really ran out of KV
        assert max(peaks) > 0.8
    assert eng.load_now().active_kv_tokens == 0


def test_export_then_import_continues_to_the_same_tokens():
    reqs = [request(f"r{i}", prompt_of(50 + i, i), 40 + 5 * i, seed=100 + i) for i in range(6)]
    reqs.append(GenerationRequest("s", prompt_of(30), SamplingParams(max_new_tokens=25, stop_token_ids=(7, 9))))

    async def uninterrupted():
        return {r.request_id: r for r in await engine().generate(reqs)}

    async def migrated(coalesce):
        a = engine(max_num_seqs=4, coalesce_steps=coalesce)
        b = engine(model="qwen2.5-7b", device="h200", coalesce_steps=coalesce)
        for r in reqs:
            a.add_request(r)
        driver = asyncio.create_task(drive(a))
        await asyncio.sleep(0.36)  # migrate mid-generation
        await a.pause()
        items = [InflightRequest.from_wire(i.to_wire()) for i in await a.export_inflight()]
        assert (await a.load()).num_running == (await a.load()).num_waiting == 0 and (await a.load()).active_kv_tokens == 0
        partial = {i.request.request_id: len(i.output_token_ids) for i in items}
        b.import_inflight(items)
        before = {rid: r for rid, (r, _) in (await driver).items()}
        return {**before, **{rid: r for rid, (r, _) in (await drive(b)).items()}}, partial

    whole = run_virtual(uninterrupted())
    continued, partial = run_virtual(migrated(coalesce=True))
    stepwise, stepwise_partial = run_virtual(migrated(coalesce=False))
    # some finished on the first engine, some were mid-way, some had not started
    assert len(partial) < len(reqs) and 0 < max(partial.values()) and min(partial.values()) == 0
    assert partial == stepwise_partial  # a coalesced run is cut at the same step boundary
    assert stepwise == continued
    for rid, result in whole.items():
        assert continued[rid].output_token_ids == result.output_token_ids, rid
        assert continued[rid].output_logprobs == result.output_logprobs, rid
    stop = whole["s"]
    assert stop.finish_reason == "stop" and stop.output_token_ids[-1] == 7
    assert not {7, 9} & set(stop.output_token_ids[:-1])


def _moved_with_kv(move_kv: bool, importer_version: int = 0, across_nodes: bool = False):
    """Eight long requests moved mid-generation from engine a to engine b, with their KV
    or without; returns (results, the moved tokens so far, b's load, b's KV counters,
    b's seconds to finish them)."""
    reqs = [request(f"r{i}", prompt_of(2000 + 37 * i, i), 400, seed=10 + i) for i in range(8)]

    async def main():
        a, b = engine(), engine()
        if importer_version:
            await b.update_weights(0, importer_version)
        for r in reqs:
            a.add_request(r)
        driver = asyncio.create_task(drive(a))
        await asyncio.sleep(1.0)
        await a.pause()
        items = [InflightRequest.from_wire(i.to_wire()) for i in await a.export_inflight()]
        kvs = [await a.export_kv(i) for i in items] if move_kv else []
        installed = [b.import_kv(kv, across_nodes=across_nodes) for kv in kvs if kv is not None]
        b.import_inflight(items)
        await driver
        began = asyncio.get_running_loop().time()
        done = {rid: r for rid, (r, _) in (await drive(b)).items()}
        took = asyncio.get_running_loop().time() - began
        moved = {i.request.request_id: len(i.request.prompt_token_ids) + len(i.output_token_ids) for i in items}
        return done, moved, await b.load(), (installed, b.kv_refused, b.kv_transfer_s), took

    return run_virtual(main())


def test_a_request_moved_with_its_kv_recomputes_one_block_and_keeps_its_tokens():
    """rollout.move_kv on emulated engines (issue 21): the importer computes only each
    moved request's last block (prefix cache), pays the transfer (NVLink within a node,
    the NIC across) instead of the prefill, and the tokens are an unmoved run's."""
    whole, moved, plain, _, plain_s = _moved_with_kv(move_kv=False)
    assert len(moved) == 8 and all(n > 2000 for n in moved.values())  # all were running
    assert plain.reprefill_tokens == sum(moved.values())  # re-prefilled: prompt + tokens so far
    for across in (False, True):
        done, moved_kv, load, (installed, refused, transfer_s), took = _moved_with_kv(True, across_nodes=across)
        assert moved_kv == moved and refused == 0
        assert {rid: r.output_token_ids for rid, r in done.items()} == \
            {rid: r.output_token_ids for rid, r in whole.items()}
        assert load.reprefill_tokens <= 16 * len(moved)  # the last block of each, at most
        assert sum(installed) == sum(n // 16 * 16 for n in moved.values())
        assert transfer_s == pytest.approx(cm.kv_transfer_time(M7, H100, sum(installed), 1, across))
        assert took < plain_s - cm.prefill_time(M7, H100, sum(moved.values())) / 2, (took, plain_s)
    # the importer holds other weights: refused, counted, re-prefilled as without KV
    _, _, stale, (installed, refused, transfer_s), _ = _moved_with_kv(True, importer_version=3)
    assert installed == [0] * 8 and refused == 8 and transfer_s == 0.0
    assert stale.reprefill_tokens == plain.reprefill_tokens


def test_import_keeps_foreign_tokens_verbatim():
    async def main():
        eng = engine()
        r = request("x", prompt_of(10), 6, seed=5)
        eng.import_inflight([InflightRequest(r, [1, 2, 3], [-0.1, -0.2, -0.3])])
        [done] = [v[0] for v in (await drive(eng)).values()]
        return done

    done = run_virtual(main())
    assert done.output_token_ids[:3] == [1, 2, 3] and done.output_logprobs[:3] == [-0.1, -0.2, -0.3]
    assert done.output_token_ids[3:] == response_tokens(5, 3, 6, 6, M7.vocab_size)


def test_follow_up_turn_hits_the_prefix_cache_and_prefills_less():
    bs = 16

    async def main():
        eng = engine(block_size=bs)
        [turn1] = await eng.generate([request("t1", prompt_of(100), 37)])
        history = turn1.prompt_token_ids + turn1.output_token_ids
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        [turn2] = await eng.generate([request("t2", history + [5, 6, 7], 10)])
        elapsed = loop.time() - t0
        await eng.update_weights(0, version=1)  # new weights: the old KV must not be reused
        [turn3] = await eng.generate([request("t3", history + [5, 6, 7], 10)])
        return turn2, elapsed, turn3, await eng.load()

    turn2, elapsed, turn3, load = run_virtual(main())
    ctx = 137 + 3
    assert turn2.cached_tokens == (137 // bs) * bs == 128
    expected = cm.prefill_time(M7, H100, ctx - 128) + sum(cm.decode_step_time(M7, H100, 1, ctx + k) for k in range(10))
    assert elapsed == pytest.approx(expected, rel=1e-9)
    assert turn3.cached_tokens == 0 and turn3.weight_version == 1
    assert load.cache_hit_tokens == 128


def test_a_follow_up_turn_on_another_engine_takes_its_context_kv_along():
    """A finished turn's context is in engine a's prefix cache: exported (export_kv of a
    request that never ran there) and imported for the next turn on engine b, b computes
    only what follows it, paying the transfer instead of the prefill."""
    bs = 16

    async def main(carry: bool):
        a, b = engine(block_size=bs), engine(block_size=bs)
        [turn1] = await a.generate([request("t1", prompt_of(100), 37)])
        history = turn1.prompt_token_ids + turn1.output_token_ids
        nxt = request("t2", history + [5, 6, 7], 10)
        kv = await a.export_kv(InflightRequest(request("t2", history, 1), [], []))
        installed = b.import_kv(kv) if carry else 0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        [turn2] = await b.generate([nxt])
        return kv, installed, turn2, loop.time() - t0

    kv, installed, moved, took = run_virtual(main(True))
    _, _, plain, plain_took = run_virtual(main(False))
    assert len(kv.token_ids) == installed == 128 and kv.request_id == "t2"  # 137 tokens: 8 full blocks
    assert moved.cached_tokens == 128 and plain.cached_tokens == 0
    assert moved.output_token_ids == plain.output_token_ids
    transfer = cm.kv_transfer_time(M7, H100, 128, 1, False)
    assert took == pytest.approx(plain_took - cm.prefill_time(M7, H100, 140) + cm.prefill_time(M7, H100, 12)
                                 + transfer, rel=1e-9)


def test_grpo_siblings_share_prompt_kv_and_hit_the_cache():
    async def main():
        eng = engine(block_size=16, coalesce_steps=False)
        for i in range(4):
            eng.add_request(request(f"g{i}", prompt_of(64), 5, seed=i))
        results = await eng.step()
        return await eng.load(), results, await drive(eng)

    load, first, done = run_virtual(main())
    assert first == [] and load.num_running == 4
    # 64 prompt tokens (4 shared blocks) counted once + each sibling's first output token
    assert load.active_kv_tokens == 64 + 4
    assert [done[f"g{i}"][0].cached_tokens for i in range(4)] == [0, 48, 48, 48]
    assert len({tuple(done[f"g{i}"][0].output_token_ids) for i in range(4)}) == 4  # seeds differ


@pytest.mark.parametrize("coalesce", [False, True], ids=["stepwise", "coalesced"])
def test_load_reports_active_kv_over_capacity(coalesce):
    two_steps = cm.prefill_time(M7, H100, 110) + cm.decode_steps_time(M7, H100, 2, 55, 2)

    async def main():
        eng = engine(kv_capacity_tokens=1000, block_size=16, coalesce_steps=coalesce)
        eng.add_request(request("a", prompt_of(100), 50))
        eng.add_request(request("b", prompt_of(10, 3), 50))
        before = await eng.load()
        driver = asyncio.create_task(drive(eng))
        await asyncio.sleep(two_steps * 1.0001)  # just after the second step ended
        after = await eng.load()
        await driver
        return before, after

    before, after = run_virtual(main())
    assert before.active_kv_tokens == 0 and before.num_waiting == 2 and before.utilization == 0
    assert after.num_running == 2 and after.num_waiting == 0
    assert after.active_kv_tokens == (100 + 2) + (10 + 2)
    assert after.utilization == pytest.approx(0.114)


@pytest.mark.parametrize("coalesce", [False, True], ids=["stepwise", "coalesced"])
def test_abort_returns_partial_outputs_and_frees_kv(coalesce):
    seven_steps = cm.prefill_time(M7, H100, 40) + cm.decode_steps_time(M7, H100, 2, 20, 7)
    eight_steps = cm.prefill_time(M7, H100, 40) + cm.decode_steps_time(M7, H100, 2, 20, 8)

    async def main():
        eng = engine(coalesce_steps=coalesce, enable_prefix_cache=False)
        eng.add_request(request("a", prompt_of(20), 100, seed=3))
        eng.add_request(request("b", prompt_of(20, 1), 100))
        driver = asyncio.create_task(drive(eng))
        await asyncio.sleep((seven_steps + eight_steps) / 2)  # during the 8th step
        aborted = await eng.abort(["a", "missing"])
        load = await eng.load()
        done = await driver
        return aborted, load, done["b"][1]

    aborted, load, b_done = run_virtual(main())
    [a] = aborted
    assert a.finish_reason == "abort" and a.output_token_ids == response_tokens(3, 0, 7, 100, M7.vocab_size)
    assert load.num_running == 1 and load.active_kv_tokens == 20 + 7
    # b: 8 steps at batch 2 (the 8th was in flight), then 92 alone
    assert b_done == pytest.approx(eight_steps + cm.decode_steps_time(M7, H100, 1, 28, 92), rel=1e-9)


def test_pause_holds_generation_until_resume():
    async def main():
        eng = engine()
        await eng.pause()
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(eng.generate([request("a", prompt_of(10), 5)]))
        await asyncio.sleep(3.0)
        assert not task.done() and not eng.has_work() and eng.num_steps == 0
        await eng.resume()
        await task
        return loop.time()

    assert run_virtual(main()) == pytest.approx(3.0 + alone_time(10, 5), rel=1e-9)


def test_weight_update_is_charged_to_the_next_step_and_versions_results():
    buckets = [("layers.0", 1_000_000_000), ("layers.1", 2_000_000_000)]

    async def main():
        eng = engine(tp=2)
        await eng.update_weights(buckets, version=4)
        loop = asyncio.get_running_loop()
        [r] = await eng.generate([request("a", prompt_of(10), 3)])
        return r, loop.time()

    r, elapsed = run_virtual(main())
    sync = 3e9 / 2 / H100.link_bandwidth
    assert r.weight_version == 4
    assert elapsed == pytest.approx(sync + alone_time(10, 3, tp=2), rel=1e-9)


def test_queue_key_orders_admission():
    async def main():
        eng = engine(max_num_seqs=1)
        eng.set_queue_key(lambda req, cached: (-req.tool_count, req.arrival_time))
        for i, tools in enumerate([0, 3, 1]):
            eng.add_request(request(f"r{i}", prompt_of(10, i), 2, tool_count=tools))
        order = [rid for rid, _ in sorted((await drive(eng)).items(), key=lambda kv: kv[1][1])]
        eng.set_queue_key(None)
        for i in range(3):
            eng.add_request(request(f"f{i}", prompt_of(10, i), 2, tool_count=i))
        fifo = [rid for rid, _ in sorted((await drive(eng)).items(), key=lambda kv: kv[1][1])]
        return order, fifo

    order, fifo = run_virtual(main())
    assert order == ["r1", "r2", "r0"]
    assert fifo == ["f0", "f1", "f2"]


def test_release_memory_needs_an_idle_engine():
    async def main():
        eng = engine(coalesce_steps=False)
        eng.add_request(request("a", prompt_of(10), 3))
        await eng.step()
        with pytest.raises(RuntimeError, match="running"):
            await eng.release_memory()
        await drive(eng)
        await eng.release_memory()
        eng.add_request(request("b", prompt_of(10), 3))
        assert not eng.has_work() and await eng.step() == []
        await eng.resume_memory()
        return await drive(eng)

    assert list(run_virtual(main())) == ["b"]


@pytest.mark.parametrize("make, match", [
    pytest.param(lambda: request("a", prompt_of(900), 200), "capacity", id="too_long"),
    pytest.param(lambda: request("a", [], 5), "empty", id="empty_prompt"),
])
def test_rejects_requests_that_cannot_run(make, match):
    eng = engine(kv_capacity_tokens=1000)
    with pytest.raises(ValueError, match=match):
        eng.add_request(make())


def test_rejects_duplicate_ids():
    eng = engine()
    eng.add_request(request("a", prompt_of(5), 5))
    with pytest.raises(ValueError, match="already"):
        eng.add_request(request("a", prompt_of(5), 5))


def test_time_scale_shrinks_real_sleeps():
    model_time = alone_time(1000, 3000)  # ~24 s of model time: ~0.24 s of real sleep at time_scale 0.01

    async def main():
        eng = engine(time_scale=0.01)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await eng.generate([request("a", prompt_of(1000), 3000)])
        return loop.time() - t0

    elapsed = asyncio.run(main())  # a real loop
    assert model_time * 0.01 <= elapsed < model_time * 0.5


def test_many_engines_in_one_loop():
    async def one(i):
        eng = engine(model="qwen2.5-1.5b")
        results = await eng.generate([request(f"{i}-{j}", prompt_of(200, j), 100 + 10 * j) for j in range(16)])
        return asyncio.get_running_loop().time(), sum(len(r.output_token_ids) for r in results)

    async def main():
        return await asyncio.gather(*(one(i) for i in range(200)))

    out = run_virtual(main())
    assert {t for t, _ in out} == {out[0][0]}  # identical engines finish together in virtual time
    assert sum(n for _, n in out) == 200 * sum(100 + 10 * j for j in range(16))


def test_preempted_request_keeps_its_output_in_the_prefix_cache():
    # A and B grow together until 2 * (32 + k) > 220 at k = 79: B (the newest) is
    # preempted with 110 tokens, 6 full blocks of which stay cached. When A finishes,
    # B comes back and re-prefills only what its cached blocks do not cover.
    async def main():
        eng = engine(kv_capacity_tokens=220, block_size=16)
        eng.add_request(request("a", prompt_of(32, 1), 80, seed=1))
        eng.add_request(request("b", prompt_of(32, 2), 100, seed=2))
        return await drive(eng), eng.scheduler.num_preemptions

    done, preemptions = run_virtual(main())
    b = done["b"][0]
    assert preemptions == 1
    assert b.cached_tokens == 96  # prompt (32) + 64 output tokens, not just the prompt
    assert b.output_token_ids == response_tokens(2, 0, 100, 100, M7.vocab_size)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), capacity=st.integers(210, 1500), block_size=st.sampled_from([1, 4, 16]),
       events=st.lists(st.tuples(st.integers(0, 60), st.sampled_from(["abort", "weights", "export"])), max_size=4),
       coalesce=st.booleans())
def test_bookkeeping_balances_under_aborts_weight_updates_and_migration(seed, capacity, block_size, events,
                                                                       coalesce):
    reqs = flood(seed, num=25)

    async def main():
        eng = engine(kv_capacity_tokens=capacity, block_size=block_size, coalesce_steps=coalesce)
        for r in reqs:
            eng.add_request(r)
        finished, step = set(), 0
        while eng.has_work():
            for r in await eng.step():
                finished.add(r.request_id)
            step += 1
            for at, what in events:
                if at == step and what == "abort":
                    finished.update(r.request_id for r in await eng.abort([f"r{seed % 25}", "r3"]))
                elif at == step and what == "weights":
                    await eng.update_weights(1000, version=step)
                elif at == step and what == "export":
                    eng.import_inflight(await eng.export_inflight())
            sched = eng.scheduler
            assert sched.used_tokens() <= capacity and (await eng.load()).active_kv_tokens <= capacity
        return finished, eng.scheduler

    finished, sched = run_virtual(main())
    assert finished == {r.request_id for r in reqs}
    assert sched.context_tokens == sched.private_tokens == 0 and not sched.running and not sched.waiting
    assert sched.cache.num_tokens == sched.cache.num_evictable_tokens  # nothing left pinned


async def scripted_run(coalesce, seed, capacity, events):
    """Drive one engine while a script pokes it at given virtual times; returns everything
    an observer could see: results, their times, and load() after each poke."""
    eng = engine(kv_capacity_tokens=capacity, block_size=4, coalesce_steps=coalesce)
    if seed % 2:  # longest cached prefix first: the queue order then depends on the cache
        eng.set_queue_key(lambda req, cached: (-cached, req.arrival_time))
    loop = asyncio.get_running_loop()
    results, seen_loads, expected = {}, [], set()

    def record(rs):
        for r in rs:
            results[r.request_id] = (tuple(r.output_token_ids), r.finish_reason, r.weight_version,
                                     r.cached_tokens, loop.time())

    prompts = {}
    for r in flood(seed, num=12):
        eng.add_request(r)
        expected.add(r.request_id)
        prompts[r.request_id] = r.prompt_token_ids
    stop = asyncio.Event()

    async def drive_until_stopped():
        while not stop.is_set():
            if eng.has_work():
                record(await eng.step())
            else:
                await asyncio.sleep(0.01)

    async def script():
        for k, (at, kind, arg) in enumerate(sorted(events)):
            await asyncio.sleep(max(0.0, at - loop.time()))
            if kind == "abort":
                record(await eng.abort([f"r{arg % 12}"]))
            elif kind == "weights":
                await eng.update_weights(arg * 10**8, version=k + 1)
            elif kind == "migrate":
                eng.import_inflight(await eng.export_inflight())
            elif kind == "pause":
                await eng.pause()
                await asyncio.sleep(0.05)
                await eng.resume()
            elif kind == "add":  # a follow-up turn of a finished request when there is one
                done = sorted(rid for rid, r in results.items() if r[1] == "length")
                prompt = prompt_of(arg % 90 + 1, arg)
                if done:
                    rid = done[arg % len(done)]
                    prompt = prompts[rid] + list(results[rid][0]) + [arg]
                prompts[f"x{k}"] = prompt
                eng.add_request(request(f"x{k}", prompt, arg % 40 + 1, seed=k))
                expected.add(f"x{k}")
            load = await eng.load()
            seen_loads.append((kind, load.active_kv_tokens, load.num_running, load.num_waiting))
        while not expected <= set(results):
            await asyncio.sleep(0.01)
        stop.set()

    await asyncio.gather(drive_until_stopped(), script())
    return results, seen_loads, eng.num_steps


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), capacity=st.integers(250, 1200),
       events=st.lists(st.tuples(st.floats(0, 1.2), st.sampled_from(["abort", "weights", "migrate", "pause", "add",
                                                                    "load"]), st.integers(0, 1000)), max_size=6))
def test_coalesced_steps_are_indistinguishable_from_single_steps(seed, capacity, events):
    stepwise, stepwise_loads, num_steps = run_virtual(scripted_run(False, seed, capacity, events))
    coalesced, coalesced_loads, coalesced_steps = run_virtual(scripted_run(True, seed, capacity, events))
    assert stepwise_loads == coalesced_loads
    assert num_steps == coalesced_steps
    assert set(stepwise) == set(coalesced)
    for rid, (*outcome, at) in stepwise.items():
        assert coalesced[rid][:-1] == tuple(outcome), rid
        assert coalesced[rid][-1] == pytest.approx(at, rel=1e-9, abs=1e-12), rid


def mean_completion(turns, key) -> float:
    """Mean virtual completion time of `turns()` all queued at once on an engine running
    two at a time, its queue ordered by `key` (None: FIFO)."""
    async def main():
        eng = engine(max_num_seqs=2, coalesce_steps=False)
        eng.set_queue_key(key)
        for r in turns():
            eng.add_request(r)
        return [t for _, t in (await drive(eng)).values()]
    times = run_virtual(main())
    return sum(times) / len(times)


def test_on_turns_that_grow_the_learned_priority_does_not_lose_to_fifo():
    """An adversarial queue for DynaRL's priority: later turns (tool calls made) are long,
    first turns short, all waiting at once on an engine that runs two at a time. The
    static (tool_count, cached_prefix) key serves the long ones first and every short
    turn waits behind them; FIFO does not; the learned key (core/priority.py
    TurnLengths, fed with an earlier step's turns that were like these) is FIFO here."""
    from dynarl.components.rollout.queue_keys import make_queue_key
    from dynarl.core.priority import PriorityConfig, TurnLengths

    def turns():
        out = []
        for i in range(8):
            out.append(request(f"first{i}", prompt_of(64, i), 20, seed=i, tool_count=0, arrival_time=0.0))
            out.append(request(f"later{i}", prompt_of(64, 100 + i), 300, seed=i, tool_count=3, arrival_time=0.0))
        return out

    config = PriorityConfig(max_bonus_s=30.0)
    learned = TurnLengths()
    for _ in range(16):  # what the engine saw in an earlier step: first turns short, later ones long
        learned.observe(0, 20)
        learned.observe(2, 300)
    fifo = mean_completion(turns, None)
    static = mean_completion(turns, make_queue_key("priority", config))
    adaptive = mean_completion(turns, make_queue_key("priority", config, lengths=learned))
    assert static > 1.3 * fifo  # the assumption fails: serving the long turns first costs the short ones
    assert adaptive == fifo
    # and where later turns are shorter, the learned key keeps the priority's order
    agreeing = TurnLengths()
    for _ in range(16):
        agreeing.observe(0, 300)
        agreeing.observe(2, 20)
    assert mean_completion(turns, make_queue_key("priority", config, lengths=agreeing)) == static


def test_on_bimodal_turns_the_priority_learned_per_turn_index_does_not_lose_to_fifo():
    """Later turns shorter on average (the pooled check keeps the priority on) but the
    third turns long: the static key serves those first; learned per turn index
    (TurnLengths.turn_keeps_bonus) they are keyed FIFO while the short second turns keep
    their bonus: better than the static key and than FIFO."""
    from dynarl.components.rollout.queue_keys import make_queue_key
    from dynarl.core.priority import PriorityConfig, TurnLengths

    def turns():
        out = []
        for i in range(6):
            out.append(request(f"first{i}", prompt_of(64, i), 100, seed=i, tool_count=0, arrival_time=0.0))
            out.append(request(f"third{i}", prompt_of(64, 100 + i), 300, seed=i, tool_count=2, arrival_time=0.0))
            out.append(request(f"second{i}", prompt_of(64, 200 + i), 20, seed=i, tool_count=1, arrival_time=0.0))
        return out

    config = PriorityConfig(max_bonus_s=30.0)
    learned = TurnLengths()
    for _ in range(16):  # an earlier step's turns: first 100, second 20 (three times as many), third 300
        learned.observe(0, 100)
        learned.observe(2, 300)
        for _ in range(3):
            learned.observe(1, 20)
    assert learned.later_turns_shorter() is True  # pooled: (3 * 20 + 300) / 4 = 90 < 100
    fifo = mean_completion(turns, None)
    static = mean_completion(turns, make_queue_key("priority", config))
    per_index = mean_completion(turns, make_queue_key("priority", config, lengths=learned))
    assert static > fifo
    assert per_index < fifo < static
