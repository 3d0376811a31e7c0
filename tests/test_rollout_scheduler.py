NUM_GPUS = 0

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.native.block_manager import BlockManager
from dynarl.components.rollout.native.radix_cache import RadixCache
from dynarl.components.rollout.native.scheduler import Scheduler
from dynarl.components.rollout.native.sequence import Sequence, Status

BS = 4


def make(num_blocks, cache=True, max_num_seqs=16, max_prefill_tokens=1024, max_model_len=1024):
    return Scheduler(BlockManager(num_blocks, BS), RadixCache(BS) if cache else None, max_num_seqs=max_num_seqs,
                     max_prefill_tokens=max_prefill_tokens, max_model_len=max_model_len)


_order = iter(range(10**9))


def seq(rid, prompt, max_new, tool_count=0, stop=(), arrival=0.0):
    tokens = prompt if isinstance(prompt, list) else [ord(rid)] * prompt  # distinct per request: no sharing
    request = GenerationRequest(rid, tokens, SamplingParams(max_new_tokens=max_new, stop_token_ids=stop),
                                tool_count=tool_count, arrival_time=arrival)
    return Sequence(request, next(_order))


def check_invariants(s: Scheduler):
    """Every block's reference count equals its holders: running block tables + the cache."""
    holders = Counter(b for q in s.running for b in q.block_table)
    if s.cache is not None:
        holders.update(n.block for n in s.cache._nodes())
    for block in range(s.blocks.num_blocks):
        assert s.blocks.ref_count(block) == holders[block], block
    assert s.blocks.num_used_blocks <= s.blocks.num_blocks
    assert s.active_kv_tokens() <= s.blocks.capacity_tokens
    for q in s.running:
        assert len(q.block_table) * BS >= q.num_computed_tokens
    assert all(q.block_table == [] for q in s.waiting)


def run(s: Scheduler, max_steps=100):
    """Drive the scheduler; the 'model' emits 1000 + output position as each token."""
    trace = []
    for _ in range(max_steps):
        batch = s.schedule()
        if batch is None:
            break
        trace.append(("P:" if batch.is_prefill else "D:") + ",".join(q.request_id for q in batch.seqs))
        if not batch.is_prefill:
            assert all(len(q.block_table) * BS >= q.num_tokens for q in batch.seqs)
        s.postprocess(batch, [1000 + q.num_output_tokens for q in batch.seqs], [0.0] * len(batch.seqs))
        check_invariants(s)
    return trace


CASES = [
    pytest.param(dict(num_blocks=8), [("a", 5, 3), ("b", 3, 2)],
                 ["P:a,b", "D:a,b", "D:a"], id="both-fit"),
    pytest.param(dict(num_blocks=8, max_num_seqs=1), [("a", 5, 3), ("b", 3, 2)],
                 ["P:a", "D:a", "D:a", "P:b", "D:b"], id="max-num-seqs"),
    pytest.param(dict(num_blocks=8, max_prefill_tokens=6), [("a", 5, 3), ("b", 3, 2)],
                 ["P:a", "P:b", "D:a,b", "D:a"], id="prefill-token-budget"),
    pytest.param(dict(num_blocks=8, max_prefill_tokens=2), [("a", 5, 1), ("b", 3, 1)],
                 ["P:a", "P:b"], id="oversized-prompt-still-admitted-alone"),
    pytest.param(dict(num_blocks=3), [("a", 9, 2), ("b", 2, 1)],
                 ["P:a", "D:a", "P:b"], id="kv-full-waits"),
    pytest.param(dict(num_blocks=4), [("a", 8, 4), ("b", 9, 1), ("c", 2, 1)],
                 ["P:a", "D:a", "D:a", "D:a", "P:b,c"], id="head-of-line-not-overtaken"),
    pytest.param(dict(num_blocks=4), [("a", 4, 8), ("b", 4, 8)],
                 ["P:a,b"] + ["D:a,b"] * 4 + ["D:a"] * 3 + ["P:b", "D:b", "D:b"], id="preempt-newest-recompute"),
    pytest.param(dict(num_blocks=4, cache=False), [("a", 4, 8), ("b", 4, 8)],
                 ["P:a,b"] + ["D:a,b"] * 4 + ["D:a"] * 3 + ["P:b", "D:b", "D:b"], id="preempt-without-cache"),
    pytest.param(dict(num_blocks=8, max_model_len=7), [("a", 5, 10)],
                 ["P:a", "D:a"], id="max-model-len"),
]


@pytest.mark.parametrize("sizes, requests, expected", CASES)
def test_schedule_trace(sizes, requests, expected):
    s = make(**sizes)
    seqs = [seq(*r) for r in requests]
    for q in seqs:
        s.add(q)
    assert run(s) == expected
    assert not s.has_work() and s.active_kv_tokens() == 0
    for q, (_, _, max_new) in zip(seqs, requests):
        assert q.status is Status.FINISHED and q.finish_reason == "length"
        assert q.output_token_ids == [1000 + i for i in range(len(q.output_token_ids))]  # no token lost or repeated
        assert len(q.output_token_ids) == min(max_new, sizes.get("max_model_len", 10**9) - q.num_prompt_tokens)


def test_preempted_sequence_resumes_from_cache():
    s = make(num_blocks=4)
    a, b = seq("a", 4, 8), seq("b", 4, 8)
    s.add(a), s.add(b)
    run(s)
    assert s.num_preemptions == 1
    assert b.num_cached_tokens == 4  # its prompt block stayed in the cache while it waited
    assert s.num_prefill_tokens == 4 + 4 + 9 and s.num_cached_tokens == 4


@pytest.mark.parametrize("key, expected", [
    pytest.param(None, ["a", "b", "c"], id="fifo-by-admission"),
    pytest.param(lambda r, cached: -r.tool_count, ["b", "c", "a"], id="most-tools-first"),
    pytest.param(lambda r, cached: -cached, ["c", "a", "b"], id="longest-cached-prefix-first"),
])
def test_queue_key_orders_admission(key, expected):
    s = make(num_blocks=16, max_num_seqs=1)
    shared = [7] * 8
    warm = seq("w", shared + [1], 1)
    s.add(warm)
    run(s)  # leaves the 8 shared tokens in the cache
    for q in (seq("a", 6, 1), seq("b", 6, 1, tool_count=2), seq("c", shared + [2, 3], 1, tool_count=1)):
        s.add(q)
    if key is not None:
        s.queue_key = key
    assert run(s) == [f"P:{r}" for r in expected]


def test_fifo_uses_arrival_time_before_admission_order():
    s = make(num_blocks=16, max_num_seqs=1)
    for q in (seq("a", 3, 1, arrival=2.0), seq("b", 3, 1, arrival=1.0), seq("c", 3, 1, arrival=1.0)):
        s.add(q)
    assert run(s) == ["P:b", "P:c", "P:a"]


def test_prefix_shared_across_turns_and_concurrent_requests():
    s = make(num_blocks=32)
    turn1 = seq("1", list(range(10)), 6)
    s.add(turn1)
    run(s)
    # turn 2 = turn 1's prompt + answer + new text: the computed part (15 tokens) is cached in full blocks
    turn2 = seq("2", turn1.token_ids + [50, 51, 52], 2)
    s.add(turn2)
    run(s)
    assert turn2.num_cached_tokens == 12
    # two requests with one prompt admitted in different steps: the later one reuses the earlier's prefill
    x, y = seq("x", list(range(100, 109)), 3), seq("y", list(range(100, 109)), 3)
    s.add(x)
    s.postprocess(batch := s.schedule(), [1], [0.0])
    s.add(y)
    assert s.schedule().seqs == [y] and y.num_cached_tokens == 8
    assert y.block_table[:2] == x.block_table[:2]


def test_prefix_cache_never_serves_the_last_token():
    s = make(num_blocks=8)
    s.add(first := seq("a", list(range(8)), 1))
    run(s)
    s.add(again := seq("b", list(range(8)), 1))
    batch = s.schedule()
    assert again.num_cached_tokens == 4  # 8 tokens cached, but the last must be computed for its logits
    assert batch.seqs == [again] and first.finish_reason == "length"


def test_stop_token_abort_pause_and_take_all():
    s = make(num_blocks=16)
    a, b, c = seq("a", 5, 10, stop=(1002,)), seq("b", 5, 10), seq("c", 5, 10)
    for q in (a, b, c):
        s.add(q)
    s.max_num_seqs = 2
    run(s, max_steps=1)
    s.paused = True
    assert s.schedule() is None and s.has_work()
    s.paused = False
    run(s, max_steps=2)
    assert a.finish_reason == "stop" and a.output_token_ids == [1000, 1001, 1002]
    aborted = s.abort(["b", "nope"])
    assert aborted == [b] and b.finish_reason == "abort" and b.block_table == []
    check_invariants(s)
    run(s, max_steps=2)
    taken = s.take_all()
    assert taken == [c] and c.status is Status.WAITING and c.block_table == [] and c.num_output_tokens == 2
    assert not s.has_work() and s.active_kv_tokens() == 0
    check_invariants(s)
    s.reset_prefix_cache()
    assert s.blocks.num_free_blocks == 16


@pytest.mark.parametrize("request_args, error", [
    pytest.param(("a", 30, 10), "capacity", id="kv-never-fits"),
    pytest.param(("a", 70, 1), "max_model_len", id="prompt-too-long"),
])
def test_rejects_what_can_never_run(request_args, error):
    s = make(num_blocks=8, max_model_len=64)
    with pytest.raises(ValueError, match=error):
        s.add(seq(*request_args))


def test_flood_of_long_requests_keeps_capacity():
    s = make(num_blocks=12, max_num_seqs=8)
    seqs = [seq(chr(65 + i), 3 + 5 * (i % 4), 14 + i % 5) for i in range(12)]
    for q in seqs:
        s.add(q)
    trace = run(s, max_steps=500)
    assert not s.has_work() and s.num_preemptions > 0
    assert all(len(q.output_token_ids) == q.request.sampling.max_new_tokens for q in seqs)
    assert len(trace) < 500


@settings(max_examples=60, deadline=None)
@given(num_blocks=st.integers(4, 16), max_num_seqs=st.integers(1, 6), use_cache=st.booleans(),
       requests=st.lists(st.tuples(st.integers(1, 14), st.integers(1, 10), st.integers(0, 2)), min_size=1, max_size=10))
def test_random_workloads_finish_and_keep_invariants(num_blocks, max_num_seqs, use_cache, requests):
    s = make(num_blocks, cache=use_cache, max_num_seqs=max_num_seqs)
    seqs = []
    for i, (prompt_len, max_new, family) in enumerate(requests):
        tokens = ([family] * 8 + [100 + i] * 14)[:prompt_len]  # requests of one family share a prefix
        q = seq(f"r{i}", tokens, max_new)
        if BS * num_blocks < prompt_len + max_new - 1:
            with pytest.raises(ValueError):
                s.add(q)
            continue
        s.add(q)
        seqs.append(q)
    run(s, max_steps=2000)
    assert not s.has_work()
    for q in seqs:
        assert q.finish_reason == "length"
        assert q.output_token_ids == [1000 + i for i in range(q.request.sampling.max_new_tokens)]
    assert s.num_cached_tokens <= s.num_prefill_tokens
    s.reset_prefix_cache()
    assert s.blocks.num_free_blocks == num_blocks


def test_kv_from_before_a_cache_reset_is_never_cached():
    """After a weight update the cache is reset; a sequence still running holds KV of the
    old weights, which must not enter the new cache when it finishes."""
    s = make(num_blocks=16)
    a = seq("a", list(range(9)), 4)
    s.add(a)
    run(s, max_steps=1)
    assert s.cache.num_blocks == 2  # the prompt's full blocks, cached after prefill
    s.reset_prefix_cache()
    assert s.cache.num_blocks == 0
    run(s)
    assert a.finish_reason == "length" and s.cache.num_blocks == 0
    b = seq("b", list(range(9)), 1)
    s.add(b)
    run(s)
    assert b.num_cached_tokens == 0 and s.cache.num_blocks == 2
    check_invariants(s)


def test_decision_modules_import_no_torch():
    import subprocess
    import sys

    code = ("import sys; import dynarl.components.rollout.native.scheduler, "
            "dynarl.components.rollout.native.radix_cache, dynarl.components.rollout.native.block_manager; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
