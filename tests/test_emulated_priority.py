NUM_GPUS = 0
"""The emulated engine's waiting queue: the native engine's key function (queue_keys.py
over core/priority.py) or FIFO, chosen by EmulatedRolloutConfig.queue."""

import pytest

from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.core.priority import PriorityConfig, fifo_key, priority_key
from dynarl.core.virtual_time import run_virtual

BLOCK = 16
WARM = [(i * 37) % 40_000 + 3 for i in range(64)]
"""A prompt the engine has served before: 64 tokens (4 blocks) in its prefix cache."""


def admission_order(queue: str, items: list[tuple[str, float, int, bool]], window_s: float = 30.0) -> list[str]:
    """Adds every item while the engine is idle (max_num_seqs=1, one token each), then
    steps: requests finish in the order they were admitted."""
    async def main():
        eng = EmulatedRolloutEngine(EmulatedRolloutConfig(model="qwen2.5-1.5b", max_num_seqs=1, block_size=BLOCK,
                                                          queue=queue, priority_window_s=window_s))
        eng.add_request(GenerationRequest("warm", list(WARM), SamplingParams(max_new_tokens=1)))
        while eng.has_work():
            await eng.step()
        for rid, arrival, tools, warm in items:
            prompt = (list(WARM) if warm else [5 + len(rid)] * 64) + [7, 8, 9]
            eng.add_request(GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=1),
                                              tool_count=tools, arrival_time=arrival))
        order = []
        while eng.has_work():
            order += [r.request_id for r in await eng.step()]
        return order
    return run_virtual(main())


def expected(key, items, window_s: float = 30.0) -> list[str]:
    config = PriorityConfig(max_bonus_s=window_s)
    cached = {True: 64, False: 0}  # WARM's 4 full blocks; a cold prompt has none
    ranked = sorted(enumerate(items), key=lambda e: (key(e[1][1], e[1][2], cached[e[1][3]], config), e[0]))
    return [item[0] for _, item in ranked]


TABLE = [
    # (id, arrival_time, tool_count, prompt starts with the cached WARM prefix)
    pytest.param([("a", 0.0, 0, False), ("b", 0.0, 3, False), ("c", 0.0, 1, False)], id="more-tools-first"),
    pytest.param([("a", 0.0, 1, False), ("b", 0.0, 1, True)], id="cached-prefix-breaks-a-tool-tie"),
    pytest.param([("a", 0.0, 1, True), ("b", 0.0, 2, False)], id="a-tool-call-outweighs-any-prefix"),
    pytest.param([("old", 0.0, 0, False), ("new", 40.0, 16, True)], id="outside-the-window-arrival-wins"),
    pytest.param([("old", 0.0, 0, False), ("new", 5.0, 16, True)], id="inside-the-window-overtakes"),
    pytest.param([("a", 3.0, 0, False), ("b", 1.0, 0, False), ("c", 2.0, 0, True)], id="equal-bonus-by-arrival"),
    pytest.param([("x", 0.0, 2, True), ("y", 1.0, 0, False), ("z", 0.5, 4, False), ("w", 2.0, 1, True)],
                 id="mixed"),
]


@pytest.mark.parametrize("items", TABLE)
def test_priority_queue_admits_in_core_priority_order(items):
    assert admission_order("priority", items) == expected(priority_key, items)


@pytest.mark.parametrize("items", TABLE)
def test_fifo_queue_admits_by_arrival(items):
    assert admission_order("fifo", items) == expected(fifo_key, items)


def test_a_zero_window_is_fifo():
    items = [("a", 0.0, 0, False), ("b", 1.0, 5, True), ("c", 0.5, 9, False)]
    assert admission_order("priority", items, window_s=0.0) == expected(fifo_key, items) == ["a", "c", "b"]


@pytest.mark.parametrize("field,value", [("queue", "lifo"), ("priority_window_s", -1.0)])
def test_bad_queue_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        EmulatedRolloutConfig(**{field: value})
