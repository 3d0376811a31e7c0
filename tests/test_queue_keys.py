NUM_GPUS = 0

import pytest
import torch

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.native.engine import NativeRolloutEngine
from dynarl.components.rollout.queue_keys import make_queue_key
from dynarl.core.priority import PriorityConfig


def engine(policy):
    torch.manual_seed(0)
    e = NativeRolloutEngine(Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"]), NativeEngineConfig(max_num_seqs=1))
    e.set_queue_key(make_queue_key(policy, PriorityConfig(max_bonus_s=10.0)))
    return e


def request(rid, arrival, tools):
    return GenerationRequest(rid, [5, 6, 7], SamplingParams(max_new_tokens=2, seed=1), tool_count=tools,
                             arrival_time=arrival)


@pytest.mark.parametrize("policy,expected", [
    pytest.param("fifo", ["new0", "new1", "turn3"], id="fifo-arrival-order"),
    pytest.param("priority", ["turn3", "new0", "new1"], id="follow-up-turn-first"),
])
async def test_engine_admits_in_queue_key_order(policy, expected):
    e = engine(policy)
    for r in (request("new0", 0.0, 0), request("new1", 0.1, 0), request("turn3", 0.2, 3)):
        e.add_request(r)
    admitted = []
    while e.has_work():
        await e.step()
        for rid in e.running_request_ids():
            if rid not in admitted:
                admitted.append(rid)
    assert admitted == expected


def test_age_bound_lets_an_old_request_through():
    key = make_queue_key("priority", PriorityConfig(max_bonus_s=10.0))
    old = request("old", 0.0, 0)
    late_hot = request("hot", 11.0, 16)  # arrived more than the window later: cannot overtake
    assert key(old, 0) < key(late_hot, 10_000)


def test_unknown_policy():
    with pytest.raises(ValueError, match="fifo or priority"):
        make_queue_key("lifo")
