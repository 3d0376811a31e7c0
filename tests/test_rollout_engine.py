NUM_GPUS = 0

import asyncio
import dataclasses
import inspect

import msgpack
import pytest
import torch

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.base import GenerationRequest, InflightRequest, KVBlocks, RolloutEngine, SamplingParams
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.native.engine import NativeRolloutEngine
from dynarl.components.rollout.native.sampling import sample

torch.set_num_threads(1)
CONFIG = TINY_CONFIGS["tiny-0.5m"]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(CONFIG, init_std=0.1).eval()  # peaked enough that greedy/top-k matter


def engine(model, **kwargs) -> NativeRolloutEngine:
    return NativeRolloutEngine(model, NativeEngineConfig(**{"block_size": 4, "num_blocks": 256, **kwargs}))


def prompt(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, CONFIG.vocab_size, (length,), generator=g).tolist()


SHARED = prompt(99, 13)
REQUESTS = [
    GenerationRequest("greedy", SHARED + prompt(1, 5), SamplingParams(temperature=0.0, max_new_tokens=12)),
    GenerationRequest("t1", SHARED + prompt(2, 9), SamplingParams(temperature=1.0, max_new_tokens=15, seed=7)),
    GenerationRequest("topk", prompt(3, 6), SamplingParams(temperature=0.8, top_k=5, max_new_tokens=10, seed=8)),
    GenerationRequest("topp", SHARED + prompt(4, 2), SamplingParams(temperature=1.2, top_p=0.7, max_new_tokens=11, seed=9)),
    GenerationRequest("both", prompt(5, 17), SamplingParams(top_k=20, top_p=0.9, max_new_tokens=9, seed=10)),
]


def reference(model, request: GenerationRequest) -> tuple[list[int], list[float]]:
    """Naive generation: a full forward over the whole sequence for every token, no cache,
    batch of one; the same sampling function with the same (seed, position) draws."""
    tokens, out, logprobs = list(request.prompt_token_ids), [], []
    for i in range(request.sampling.max_new_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([tokens]))[:, -1]
        (token,), (logprob,) = sample(logits, [request.sampling], [i], torch.Generator())
        tokens.append(token), out.append(token), logprobs.append(logprob)
        if token in request.sampling.stop_token_ids:
            break
    return out, logprobs


@pytest.fixture(scope="module")
def expected(model):
    return {r.request_id: reference(model, r) for r in REQUESTS}


def check(results, expected, atol=1e-5):
    for r in results:
        tokens, logprobs = expected[r.request_id]
        assert r.output_token_ids == tokens, r.request_id
        torch.testing.assert_close(torch.tensor(r.output_logprobs), torch.tensor(logprobs), atol=atol, rtol=0)


def test_engine_meets_protocol(model):
    """RolloutEngine is not runtime-checkable: compare members and their async-ness."""
    e = engine(model)
    members = [n for n in vars(RolloutEngine) if not n.startswith("_")]
    assert len(members) >= 13 and hasattr(e, "weight_version")
    for name in members:
        assert inspect.iscoroutinefunction(getattr(RolloutEngine, name)) == \
            inspect.iscoroutinefunction(getattr(e, name)), name
        assert list(inspect.signature(getattr(RolloutEngine, name)).parameters)[1:] == \
            list(inspect.signature(getattr(e, name)).parameters), name


@pytest.mark.parametrize("settings", [
    pytest.param(dict(), id="all-at-once-prefix-cache"),
    pytest.param(dict(enable_prefix_cache=False), id="no-prefix-cache"),
    pytest.param(dict(max_num_seqs=2), id="two-at-a-time"),
    pytest.param(dict(max_prefill_tokens=8, block_size=16), id="one-prefill-per-step-big-blocks"),
    pytest.param(dict(num_blocks=14), id="tiny-kv-forces-preemption"),
])
async def test_same_tokens_whatever_the_batch(model, expected, settings):
    """Each request's tokens equal a naive batch-of-one full-forward generation with the
    same seed, whatever else runs beside it, with or without the prefix cache, with
    preemption and recompute. Logits are not bitwise equal across these runs: a batched
    matmul over a different number of rows, attention over a differently padded key
    length, or KV computed in a different prefill can round differently in float32
    (~1e-7). Sampling reads logits only through one row's CDF, so a token could change
    only if its uniform draw fell within ~1e-7 of a CDF boundary; for these fixed seeds
    it does not, so tokens must be identical and logprobs equal within 1e-5."""
    e = engine(model, **settings)
    warm = GenerationRequest("warm", SHARED + prompt(6, 3), SamplingParams(max_new_tokens=3, seed=1))
    await e.generate([warm])  # puts SHARED in the prefix cache, when there is one
    extra = [GenerationRequest(f"x{i}", prompt(20 + i, 4 + 3 * i), SamplingParams(max_new_tokens=6, seed=i))
             for i in range(3)]
    results = await e.generate(extra[:1] + REQUESTS + extra[1:])
    check([r for r in results if not r.request_id.startswith("x")], expected)
    assert all(r.finish_reason == "length" for r in results)
    if settings.get("num_blocks") == 14:
        assert e.stats().preemptions > 0
    if settings == {}:
        assert {r.request_id: r.cached_tokens for r in results if r.request_id in ("t1", "topp")} == {"t1": 12, "topp": 12}


async def test_stop_token_ends_the_request(model, expected):
    tokens, _ = expected["greedy"]
    stop = tokens[4]
    request = dataclasses.replace(REQUESTS[0], sampling=SamplingParams(temperature=0.0, max_new_tokens=12,
                                                                       stop_token_ids=(stop,)))
    (result,) = await engine(model).generate([request])
    assert result.finish_reason == "stop"
    assert result.output_token_ids == tokens[:tokens.index(stop) + 1]


async def test_multiturn_conversation_reuses_its_prefix(model):
    cached, outputs = [], {}
    for use_cache in (True, False):
        e = engine(model, enable_prefix_cache=use_cache)
        history = prompt(30, 10)
        for turn in range(4):
            history = history + prompt(40 + turn, 5)
            (result,) = await e.generate([GenerationRequest(f"turn{turn}", history, SamplingParams(max_new_tokens=6, seed=turn))])
            history = history + result.output_token_ids
            if use_cache:
                cached.append(result.cached_tokens)
        outputs[use_cache] = history
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]) and cached == sorted(cached)
    # everything but the newest user message and the last generated token was cached
    assert cached[1] == (10 + 5 + 6 - 1) // 4 * 4
    assert outputs[True] == outputs[False]


async def test_capacity_never_exceeded_under_a_flood(model):
    e = engine(model, num_blocks=20)  # 80 tokens of KV for ~1000 tokens of requests
    requests = [GenerationRequest(f"r{i}", prompt(50 + i, 20 + i % 7 * 3), SamplingParams(max_new_tokens=25 + i % 5, seed=i))
                for i in range(24)]
    for r in requests:
        e.add_request(r)
    results = []
    while e.has_work():
        results += await e.step()
        load = await e.load()
        assert load.active_kv_tokens <= load.kv_capacity_tokens == 80
        assert e.stats().used_blocks <= 20
        assert 0.0 <= load.utilization <= 1.0
    assert e.stats().preemptions > 0
    roomy = await engine(model).generate(requests)
    assert sorted((r.request_id, r.output_token_ids) for r in results) == \
        sorted((r.request_id, r.output_token_ids) for r in roomy)


async def test_export_then_import_finishes_like_an_uninterrupted_run(model, expected):
    first = engine(model, max_num_seqs=3)
    for r in REQUESTS:
        first.add_request(r)
    for _ in range(6):
        await first.step()
    await first.pause()
    assert (await first.load()).num_running == 3 and (await first.load()).num_waiting == 2
    exported = await first.export_inflight()
    assert not first.has_work() and (await first.load()).active_kv_tokens == 0 and (await first.load()).num_running == 0
    assert any(item.output_token_ids for item in exported) and any(not item.output_token_ids for item in exported)
    wire = msgpack.unpackb(msgpack.packb([item.to_wire() for item in exported]))
    second = engine(model, block_size=8, enable_prefix_cache=False)  # a different engine layout
    second.import_inflight([InflightRequest.from_wire(d) for d in wire])
    results = []
    while second.has_work():
        results += await second.step()
    assert sorted(r.request_id for r in results) == sorted(r.request_id for r in REQUESTS)
    check(results, expected)


async def test_import_of_a_finished_request_returns_it(model):
    request = GenerationRequest("done", prompt(7, 5), SamplingParams(max_new_tokens=2))
    e = engine(model)
    e.import_inflight([InflightRequest(request, [5, 6], [-1.0, -2.0])])
    assert e.has_work()
    (result,) = await e.step()
    assert (result.output_token_ids, result.finish_reason) == ([5, 6], "length")


async def test_update_weights_sets_version_and_is_used(model):
    own = Qwen2ForCausalLM(CONFIG).eval()
    own.load_state_dict(model.state_dict())
    e = NativeRolloutEngine(own, NativeEngineConfig(block_size=4, num_blocks=64), weight_version=0)
    request = REQUESTS[0]  # greedy
    before = await e.generate([request])
    assert before[0].weight_version == 0
    again = await e.generate([dataclasses.replace(request, request_id="again")])
    assert again[0].cached_tokens > 0
    torch.manual_seed(1)
    new = Qwen2ForCausalLM(CONFIG, init_std=0.1).eval()
    await e.update_weights(((name, t.clone()) for name, t in new.state_dict().items()), version=3)
    (after,) = await e.generate([dataclasses.replace(request, request_id="after")])
    assert after.weight_version == 3 and e.weight_version == 3
    assert after.cached_tokens == 0  # the cache held KV of the old weights
    assert after.output_token_ids == reference(new, request)[0] != before[0].output_token_ids
    with pytest.raises(ValueError, match="model.nope"):
        await e.update_weights({"model.nope": torch.zeros(1)}, version=4)


async def test_weight_update_mid_request_reports_the_last_version(model):
    own = Qwen2ForCausalLM(CONFIG).eval()
    own.load_state_dict(model.state_dict())
    e = NativeRolloutEngine(own, NativeEngineConfig(block_size=4, num_blocks=64))
    e.add_request(REQUESTS[1])
    for _ in range(3):
        await e.step()
    await e.update_weights({"model.norm.weight": own.model.norm.weight.detach() * 1.5}, version=1)
    results = []
    while e.has_work():
        results += await e.step()
    assert results[0].weight_version == 1 and len(results[0].output_token_ids) == 15


async def test_pause_abort_and_generate(model):
    e = engine(model)
    await e.pause()
    task = asyncio.create_task(e.generate(REQUESTS[:3]))
    await asyncio.sleep(0.01)
    assert not task.done() and not e.has_work() and await e.step() == []
    assert (await e.load()).num_waiting == 3
    aborted = await e.abort(["topk", "missing"])
    assert [(r.request_id, r.finish_reason, r.output_token_ids) for r in aborted] == [("topk", "abort", [])]
    await e.resume()
    for _ in range(10_000):  # generate() steps the engine in between our awaits
        await asyncio.sleep(0.001)
        if (await e.load()).num_running and all(s.num_output_tokens >= 2 for s in e.scheduler.running):
            break
    (mid,) = await e.abort(["t1"])
    assert mid.finish_reason == "abort" and len(mid.output_token_ids) >= 2
    results = await task
    assert [r.finish_reason for r in results] == ["length", "abort", "abort"]
    assert (await e.load()).active_kv_tokens == 0 and not e.has_work()


async def test_export_while_generate_waits(model):
    e = engine(model)
    await e.pause()
    task = asyncio.create_task(e.generate(REQUESTS[:2]))
    await asyncio.sleep(0.01)
    exported = await e.export_inflight()
    results = await asyncio.wait_for(task, 30)
    assert [r.finish_reason for r in results] == ["abort", "abort"] and len(exported) == 2


async def test_release_and_resume_memory(model, expected):
    e = engine(model)
    for r in REQUESTS:
        e.add_request(r)
    for _ in range(4):
        await e.step()
    with pytest.raises(RuntimeError, match="running"):
        await e.release_memory()
    await e.pause()
    inflight = await e.export_inflight()
    await e.release_memory()
    assert e.runner.cache is None and (await e.load()).active_kv_tokens == 0 and e.scheduler.cache.num_blocks == 0
    e.import_inflight(inflight)  # queued while released
    await e.resume()
    assert not e.has_work() and await e.step() == [] and (await e.load()).num_waiting == len(REQUESTS)
    await e.resume_memory()
    results = []
    while e.has_work():
        results += await e.step()
    check(results, expected)


def _poison(e: NativeRolloutEngine) -> None:
    """What an uninitialised cache may hold: NaN in every block not yet handed out."""
    top = e.scheduler.blocks.high_water
    e.runner.cache.k[:, top:] = float("nan")
    e.runner.cache.v[:, top:] = float("nan")


async def test_kv_blocks_are_zeroed_as_first_handed_out_and_the_rest_never_touched(model, expected):
    """The cache is allocated uninitialised; a block is zeroed when the block manager first
    hands it out (lowest first), before the engine writes or reads it: NaN garbage in
    the blocks beyond never reaches a token (0 x NaN in masked attention would), and
    those blocks are never written (on a CPU, never mapped)."""
    e = engine(model)
    _poison(e)
    for r in REQUESTS:
        e.add_request(r)
    results = []
    while e.has_work():
        results += await e.step()
    check(results, expected)
    top = e.scheduler.blocks.high_water
    assert 0 < top == e.runner.zeroed < e.config.num_blocks
    assert torch.isnan(e.runner.cache.k[:, top:]).all() and not torch.isnan(e.runner.cache.k[:, :top]).any()
    await e.release_memory()  # a new, uninitialised cache: zeroed again up to the same mark
    await e.resume_memory()
    assert e.runner.zeroed == top
    _poison(e)
    for r in REQUESTS:
        e.add_request(dataclasses.replace(r, request_id=r.request_id + "/again"))
    again = []
    while e.has_work():
        again += await e.step()
    check([dataclasses.replace(r, request_id=r.request_id.removesuffix("/again")) for r in again], expected)


async def test_queue_key_orders_the_waiting_requests(model):
    e = engine(model, max_num_seqs=1)
    e.set_queue_key(lambda request, cached: -request.tool_count)
    requests = [GenerationRequest(f"q{i}", prompt(60 + i, 5), SamplingParams(max_new_tokens=2), tool_count=t)
                for i, t in enumerate([0, 3, 1])]
    for r in requests:
        e.add_request(r)
    order = []
    while e.has_work():
        order += [r.request_id for r in await e.step()]
    assert order == ["q1", "q2", "q0"]
    e.set_queue_key(None)
    assert e.scheduler.queue_key.__name__ == "fifo_key"


@pytest.mark.parametrize("request_, error", [
    pytest.param(GenerationRequest("big", [CONFIG.vocab_size], SamplingParams()), "token ids", id="token-out-of-vocab"),
    pytest.param(GenerationRequest("long", [3] * 60, SamplingParams(max_new_tokens=10)), "capacity", id="never-fits"),
    pytest.param(GenerationRequest("empty", [], SamplingParams()), "empty", id="empty-prompt"),
])
def test_rejects_bad_requests(model, request_, error):
    e = engine(model, num_blocks=16)
    with pytest.raises(ValueError, match=error):
        e.add_request(request_)
    e.add_request(GenerationRequest("dup", [3], SamplingParams(max_new_tokens=4)))
    with pytest.raises(ValueError, match="already"):
        e.add_request(GenerationRequest("dup", [4], SamplingParams(max_new_tokens=4)))


# --- prefix-preserving migration: the KV moves with the request -------------------------

async def _moved(model, *, move_kv: bool, version: int = 0):
    """Five requests stepped 6 times on one engine, exported mid-generation (with their
    KV or not) into another; that one's results and counters."""
    first = engine(model)
    for r in REQUESTS:
        first.add_request(r)
    for _ in range(6):
        await first.step()
    await first.pause()
    exported = await first.export_inflight()
    kvs = [await first.export_kv(i) for i in exported]
    second = NativeRolloutEngine(model, NativeEngineConfig(block_size=4, num_blocks=256), weight_version=version)
    installed = [second.import_kv(KVBlocks.from_wire(msgpack.unpackb(msgpack.packb(
        kv.to_wire(), default=_tensor), ext_hook=_ext))) for kv in kvs if kv is not None] if move_kv else []
    second.import_inflight(exported)
    results = []
    while second.has_work():
        results += await second.step()
    return results, installed, second.stats()


def _tensor(obj):  # a stand-in for the wire's tensor frames: raw float32 bytes and the shape
    return msgpack.ExtType(1, msgpack.packb([list(obj.shape), obj.numpy().tobytes()]))


def _ext(code, data):
    shape, raw = msgpack.unpackb(data)
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)


async def test_a_request_moved_with_its_kv_continues_to_the_same_tokens(model, expected):
    results, installed, stats = await _moved(model, move_kv=True)
    assert sorted(r.request_id for r in results) == sorted(r.request_id for r in REQUESTS)
    check(results, expected)  # the same tokens as an unmoved run
    assert sum(installed) > 0 and stats.kv_imported_tokens == sum(installed) and stats.kv_refused == 0
    _, _, re_prefilled = await _moved(model, move_kv=False)
    # with the KV only each request's last partial block (< 4 tokens) is computed again
    assert stats.reprefill_tokens < 4 * len(REQUESTS) <= re_prefilled.reprefill_tokens


async def test_kv_of_other_weights_is_refused_and_the_request_re_prefilled(model, expected):
    results, installed, stats = await _moved(model, move_kv=True, version=3)  # the importer holds v3
    assert installed and not any(installed) and stats.kv_refused == len(installed)
    check(results, expected)
    _, _, re_prefilled = await _moved(model, move_kv=False)
    assert stats.reprefill_tokens == re_prefilled.reprefill_tokens
