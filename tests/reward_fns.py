"""Reward functions for tests/test_reward_function.py, written as users would: the
module form (reward_fns:NAME, tests/ on the import path) and the file form
(tests/reward_fns.py:NAME). Standard library only: the sandbox runs them too."""
import asyncio
import math
import socket
import threading
import time


def exact(response, answer):
    return float(response == answer)


async def exact_async(response, answer):
    await asyncio.sleep(0)
    return float(response == answer)


def named(response, answer):
    return {"reward": float(response == answer), "length": len(response), "note": "not a number: not logged",
            "nan_score": math.nan}


def context(response, answer, *, prompt, sample_id, metadata):
    """Echoes what it was given, as named scores."""
    return {"reward": 0.5, "prompt_len": len(prompt), "sample": int(sample_id.rsplit("/", 1)[1]),
            "meta": float(metadata.get("level", -1))}


def everything(response, answer, **context):
    return {"reward": 1.0, "keys": len(context)}


def batch(responses, answers):
    return [float(r == a) for r, a in zip(responses, answers)]


async def batch_async(responses, answers, *, sample_ids):
    await asyncio.sleep(0)
    return [{"reward": float(r == a), "index": int(s.rsplit("/", 1)[1])} for r, a, s in zip(responses, answers, sample_ids)]


def batch_short(responses, answers):
    return [1.0]


def flaky(response, answer, *, sample_id):
    """By the sample's place in its group: /1 raises, /2 returns NaN, /3 a string, /4
    sleeps past a short timeout; the others score like the count-up verifier."""
    k = sample_id.rsplit("/", 1)[1]
    if k == "1":
        raise ValueError(f"no reward for {sample_id}")
    if k == "2":
        return math.nan
    if k == "3":
        return "high"
    if k == "4":
        time.sleep(1.5)
    if response == answer:
        return 1.0
    return 0.5 * sum(a == b for a, b in zip(response, answer)) / max(len(response), len(answer), 1)


async def slow_async(response, answer):
    await asyncio.sleep(30)
    return 1.0


RELEASE = threading.Event()
"""Set by a test to let `hang`'s calls return."""


def hang(response, answer):
    """Does not return on "hang" until the test sets RELEASE (a minute at most)."""
    if response == "hang":
        RELEASE.wait(60)
    return 1.0


def spin(response, answer):
    """A busy loop on "spin" (the sandbox's timer stops it; bounded at 30 s all the same)."""
    deadline = time.monotonic() + 30
    while response == "spin" and time.monotonic() < deadline:
        pass
    return 1.0


def network(response, answer):
    socket.create_connection(("example.com", 80), timeout=2)
    return 1.0


def write_outside(response, answer):
    with open("/var/tmp/dynarl-reward-escape", "w") as f:
        f.write("escaped")
    return 1.0


def chatty(response, answer):
    print("x" * 100_000)
    return 1.0


not_callable = 3


def needs_more(response, answer, reference_solution):
    return 1.0


def by_row(response, answer, *, metadata, problem_id, prompt):
    """A dataset row's metadata is its own: its "row" field is the row number in its id."""
    return {"reward": float(response.strip() == answer), "level": float(metadata["level"]),
            "row_matches": float(metadata["row"] == int(problem_id.rsplit(":r", 1)[1])),
            "prompt_matches": float(prompt == metadata["text"])}
