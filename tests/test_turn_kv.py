"""A follow-up turn whose last rank leaves the step takes that rank's KV of its context
along (rollout.move_kv): the leaving rank offers it (offer_prefixes), the rank the
turn goes to moves it into its prefix cache before queueing the turn, so the turn's
context is not computed again, and its tokens are those it makes without the move."""
import asyncio

import pytest
from conftest import assert_reaped

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.components.experience import END
from dynarl.components.model.spec import ModelSpec
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.stage_results import RolloutStats
from dynarl.components.workflows.agentic_rollout import AgenticRolloutWorker
from dynarl.components.rollout.turn import TurnRequest, TurnResult

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "stop_token_ids": []}
PROMPT = list(range(3, 33))




async def _turns(launcher: str, carry: bool) -> tuple[list[int], TurnResult, RolloutStats]:
    """Turn 0 on rank 0, then (rank 0 leaving) turn 1 on rank 1, with rank 0's KV of the
    context if `carry`. Returns turn 1's output, its result and rank 1's counters."""
    config = RuntimeConfig(launcher=launcher, cluster=ClusterConfig(devices_per_node=2))
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(AgenticRolloutWorker, name="rollout", devices=[0, 1], init={
            "model": ModelSpec(name="tiny-0.5m"), "engine": NativeEngineConfig(num_blocks=256, max_num_seqs=8),
            "bucket_bytes": 1 << 20, "move_kv": True, "kv_choice": "always"})
        keys = [h.spec.worker_id for h in group.handles]
        turns, results = ctl.channel("turns"), ctl.channel("results")

        async def serve(position: int, turn: TurnRequest) -> tuple[TurnResult, RolloutStats]:
            call = asyncio.ensure_future(group.on([position]).call(AgenticRolloutWorker.serve_turns, "turns", "results",
                                                                   keys[position], -1, SAMPLING))
            await turns.put(turn, key=keys[position])
            result = await results.get()
            await turns.put(END, key=keys[position])
            return result, (await call)[0]

        first, _ = await serve(0, TurnRequest(id="e#0", prompt_ids=PROMPT, seed=7, tool_count=0,
                                   max_new_tokens=12))
        context = PROMPT + first.output_ids
        turn = TurnRequest(id="e#1", prompt_ids=context + [40, 41, 42], seed=8, tool_count=1, max_new_tokens=8)
        if carry:
            [offer] = await group.handles[0].call(AgenticRolloutWorker.offer_prefixes, [["e#1", context]])
            assert offer is not None and offer[0] == (len(context) - 1) // 16 * 16 == 32  # full blocks with KV
            turn.kv, turn.node = [offer], group.handles[0].spec.node
        second, stats = await serve(1, turn)
        pids = group.pids if launcher == "local" else []  # inproc: the ranks are this process
    assert_reaped(pids)
    return second.output_ids, second, stats


@pytest.mark.parametrize("launcher", ["inproc", "local"])
async def test_a_follow_up_turn_takes_its_context_kv_from_the_rank_it_leaves(launcher):
    plain_out, plain, plain_stats = await _turns(launcher, carry=False)
    moved_out, moved, stats = await _turns(launcher, carry=True)
    assert moved_out == plain_out  # the same tokens as prefilling the context again
    assert plain.cached_tokens == 0 and plain_stats.turn_kv_requests == 0
    assert moved.cached_tokens == 32  # the context's two full blocks came from rank 0 (no KV for its last token)
    assert stats.turn_kv_requests == 1 and stats.turn_kv_tokens == 32 and stats.turn_kv_reprefilled == 0
    assert stats.turn_kv_s > 0
