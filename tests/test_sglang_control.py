NUM_GPUS = 0
"""The SGLang rollout adapter against the fake engine (see test_sglang_rollout.py):
bucketed weight updates, release/resume memory, priority, config."""
import pytest
import torch

from dynarl import ConfigError
from dynarl.components.extras import is_available
from dynarl.components.rollout.sglang.config import SGLangConfig
from dynarl.components.rollout.sglang.engine import SGLangRolloutEngine
from dynarl.components.rollout.sglang.weights import encode_buckets
from fakes import sglang_io_struct as fake_io
from fakes.sglang_engine import FakeTokenizerManager, FakeTokenizerManagerOld
from fakes.sglang_harness import expected, fake_sglang, make, req, ticks  # noqa: F401  (fixtures)


# ---- weights, memory, priority ------------------------------------------------------------

@pytest.mark.parametrize("tm_cls", [FakeTokenizerManager, FakeTokenizerManagerOld],
                         ids=["0.5.23-session", "old-build"])
async def test_update_weights_in_buckets_while_generating(make, tm_cls):
    eng, tm = make(tm_cls=tm_cls, tp_size=2)
    eng.add_request(req("r", [5, 6], 30))
    await ticks(6)
    buckets = [[("model.embed_tokens.weight", torch.ones(4, 2))], [("lm_head.weight", torch.full((4, 2), 2.0))]]
    await eng.update_weights_in_buckets(buckets, version=3)
    assert torch.equal(tm.weights["lm_head.weight"], buckets[1][0][1]) and len(tm.update_calls) == 2
    assert all(call["flush_cache"] is False for call in tm.update_calls)  # one flush at the end
    assert tm.weight_version == "3" and eng.weight_version == 3
    assert getattr(tm, "session_open", False) is False and not tm.is_pause
    result = (await eng.step())[0]
    assert result.finish_reason == "length" and result.weight_version == 3
    assert result.output_token_ids == expected([5, 6], 30)[0]  # retracted and recomputed, nothing lost


async def test_release_right_after_the_last_result_waits_for_sglang_to_go_idle(make):
    """The batch that finished the last request is still SGLang's last batch until its
    loop turns once more: a release then would fail SGLang's idle assertion (and kill its
    scheduler, as a real run showed). The adapter waits for idle (a flush) first."""
    eng, tm = make(tick_s=0.05)  # the scheduler's next turn comes 50 ms after the last batch
    [result] = await eng.generate([req("r", [5, 6], 4)])
    assert result.finish_reason == "length" and tm.last_batch  # not idle yet
    await eng.release_memory(["kv_cache"])
    assert tm.released == {"kv_cache"} and not tm.last_batch
    await eng.resume_memory(["kv_cache"])
    assert [r.request_id for r in await eng.generate([req("s", [7], 3)])] == ["s"]


async def test_payloads_encoded_in_another_process_are_passed_on(make):
    eng, tm = make(tp_size=2)
    bucket = [("lm_head.weight", torch.full((4, 2), 5.0))]
    payloads = list(encode_buckets([bucket], 2, tm.encode))  # the trainer's side
    assert len(payloads) == 1 and len(payloads[0][0]) == 2  # one payload per TP rank
    await eng.update_weights_from_payloads(payloads, version=7)
    assert torch.equal(tm.weights["lm_head.weight"], bucket[0][1]) and eng.weight_version == 7
    await eng.release_memory(["weights"])
    with pytest.raises(RuntimeError, match="resume_memory"):
        await eng.update_weights_from_payloads(payloads, version=8)


async def test_a_failed_update_closes_the_session(make):
    eng, tm = make(tp_size=2)
    eng.config.tp_size = 3  # three payloads for a two-rank engine: SGLang's IndexError
    with pytest.raises(IndexError):
        await eng.update_weights({"lm_head.weight": torch.zeros(4, 2)}, version=1)
    assert tm.session_open is False and not tm.is_pause and eng.weight_version == 0


async def test_release_memory_needs_sglang_idle_or_paused(make):
    eng, tm = make()
    eng.add_request(req("r", [5, 6], 30))
    await ticks(6)
    with pytest.raises(RuntimeError, match="pause"):
        await eng.release_memory()
    with pytest.raises(AssertionError):  # the fake enforces SGLang's idle assert
        await tm.release_memory_occupation(fake_io.ReleaseMemoryOccupationReqInput(), None)
    await eng.pause()
    await eng.release_memory(["kv_cache", "weights", "cuda_graph"])
    assert tm.released == {"kv_cache", "weights", "cuda_graph"}
    eng.add_request(req("while-released", [7], 3))
    await eng.resume()
    await ticks(5)
    assert tm.in_generate == 1 and not eng.has_work()  # only "r" is in SGLang; nothing runs
    await eng.resume_memory(["kv_cache", "weights", "cuda_graph"])
    results = []
    while eng.has_work():
        results += await eng.step()
    assert sorted(r.request_id for r in results) == ["r", "while-released"]


async def test_priority_reaches_sglang_with_a_queue_key(make):
    eng, tm = make(capacity=12, enable_priority_scheduling=True)
    eng.set_queue_key(lambda request, cached: -request.tool_count)
    eng.add_request(req("busy", list(range(3, 11)), 3))  # fills the KV: the others queue
    await ticks(2)
    eng.add_request(req("low", [5, 6], 2, tool_count=0))
    eng.add_request(req("high", [7, 8], 2, tool_count=3))
    while eng.has_work():
        await eng.step()
    assert tm.admitted_order[1:] == [eng._rids.prefix + f"{2:016x}", eng._rids.prefix + f"{1:016x}"]


async def test_without_a_queue_key_requests_are_fcfs(make):
    eng, tm = make(capacity=12, enable_priority_scheduling=True)
    eng.add_request(req("busy", list(range(3, 11)), 3))
    await ticks(2)
    eng.add_request(req("low", [5, 6], 2, tool_count=0))
    eng.add_request(req("high", [7, 8], 2, tool_count=3))
    while eng.has_work():
        await eng.step()
    assert tm.admitted_order[1:] == [eng._rids.prefix + f"{1:016x}", eng._rids.prefix + f"{2:016x}"]


# ---- config ------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, message", [
    pytest.param({"schedule_policy": "priority"}, "schedule_policy", id="no-priority-policy"),
    pytest.param({"enable_priority_scheduling": True, "schedule_policy": "lpm"}, "fcfs", id="priority-needs-fcfs"),
    pytest.param({"tp_size": 0}, "tp_size", id="tp"),
    pytest.param({"server_args": {"tp_size": 2}}, "repeats", id="server-args-clash"),
    pytest.param({"mem_fraction_static": 1.5}, "mem_fraction_static", id="fraction"),
])
def test_config_is_checked_without_sglang(fields, message):
    with pytest.raises(ValueError, match=message):
        SGLangConfig(model_path="m", **fields)


def test_engine_kwargs():
    kwargs = SGLangConfig(model_path="m", tp_size=2, mem_fraction_static=0.6, server_args={"context_length": 4096}
                          ).engine_kwargs()
    assert kwargs["skip_tokenizer_init"] is True and kwargs["enable_memory_saver"] is True
    assert kwargs["tp_size"] == 2 and kwargs["context_length"] == 4096 and "max_running_requests" not in kwargs


@pytest.mark.skipif(is_available("sglang"), reason="sglang is installed")
def test_start_without_the_extra_names_the_pip_command():
    with pytest.raises(ConfigError, match=r"pip install 'dynarl\[sglang\]'") as info:
        SGLangRolloutEngine.start(SGLangConfig(model_path="m"))
    assert info.value.path == "rollout.backend"


async def test_a_release_sglang_refuses_leaves_the_engine_serving(make, monkeypatch):
    """SGLang refuses to release (its call fails): the engine keeps its memory and its
    gate, so what it holds and what comes later still run once it resumes (a released
    rollout rank whose release failed must still serve when it rejoins)."""
    eng, tm = make()
    eng.add_request(req("r", [5, 6], 30))
    await ticks(6)
    await eng.pause()

    async def refuse(obj, request=None):
        raise RuntimeError("release_memory_occupation failed (fault injection)")
    monkeypatch.setattr(tm, "release_memory_occupation", refuse)
    with pytest.raises(RuntimeError, match="fault injection"):
        await eng.release_memory()
    assert tm.released == set()
    eng.add_request(req("after", [7], 3))
    await eng.resume()
    results = []
    while eng.has_work():
        results += await eng.step()
    assert sorted(r.request_id for r in results) == ["after", "r"]
