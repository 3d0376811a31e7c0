"""A reward function for the built-in count-up task, written as a user would
(docs/reward.md): the task's own partial credit, reimplemented, with two named scores
that the run logs beside the reward (metrics.jsonl reward_scores/exact, /length_gap).

    dynarl train reward.function=examples/reward_function.py:count_up
    dynarl train examples/reward_function.yaml          # the same, from a config file
    dynarl train reward.function=examples/reward_function.py:count_up_batch reward.batched=true
    dynarl train reward.function=examples/reward_function.py:count_up reward.sandbox=true

The prompt reads "d>k:" (count from d to k) and the reference answer is "defghijk".
Only the standard library is used, so the same file runs in the sandbox too.
"""
from __future__ import annotations


def count_up(response: str, answer: str, prompt: str = "") -> dict[str, float]:
    """1 for the exact answer; otherwise half the fraction of positions that match (over
    the longer of the two), so stopping one symbol early or late still beats a wrong chain
    and a group's samples differ in reward."""
    if response == answer:
        reward = 1.0
    else:
        matches = sum(a == b for a, b in zip(response, answer))
        reward = 0.5 * matches / max(len(response), len(answer), 1)
    return {"reward": reward,
            "exact": float(response == answer),
            # > 0: the response runs past the end symbol; < 0: it stops early
            "length_gap": float(len(response) - len(answer))}


def count_up_batch(responses: list[str], answers: list[str]) -> list[dict[str, float]]:
    """The same, batched (reward.batched true): a chunk's samples in one call."""
    return [count_up(response, answer) for response, answer in zip(responses, answers)]
