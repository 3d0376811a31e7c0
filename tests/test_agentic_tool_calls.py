NUM_GPUS = 0
"""Tool-call parsing, observations, the per-turn decision, and the episode driver's
bookkeeping (masks, malformed calls counted, re-prefill measured, routing)."""

import asyncio

import pytest

from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.tasks.tool_syntax import Answer, Call, Malformed, observation_text, parse_turn
from dynarl.components.tools.calculator import calculate
from dynarl.components.workflows.episodes import Episode, EpisodeDriver, Limits, ReactTurns, ScriptedTurns, next_action
from dynarl.components.rollout.turn import TurnResult

LIMITS = Limits(max_turns=3, max_new_tokens=20, max_context=100, max_observation_chars=24)


@pytest.mark.parametrize("text, stopped, parsed", [
    ("[calc 347*29]", True, Call("calc", "347*29")),
    ("let me see [calc 3 + 4]", True, Call("calc", "3 + 4")),         # prose before the call
    ("[py print(2**70)]", True, Call("py", "print(2**70)")),
    ("[calc [1]]", True, Malformed("expected '[tool argument]'")),     # the last '[' opens "[1]]"
    ("10063", False, Answer("10063")),
    (" 10063 ", False, Answer("10063")),
    ("[calc 3*4", False, Answer("[calc 3*4")),                        # length cap, no ']': an (unusable) answer
    ("calc 3*4]", True, Malformed("no '[' before ']'")),
    ("[calc]", True, Malformed("expected '[tool argument]'")),
    ("[calc ]", True, Malformed("expected '[tool argument]'")),
    ("[calc  ]", True, Malformed("empty argument")),
    ("[sum 3*4]", True, Malformed("unknown tool 'sum'")),
    ("[Calc 3*4]", True, Malformed("expected '[tool argument]'")),
    ("[calc " + "1+" * 100 + "1]", True, Malformed("argument longer than 200 characters")),
])
def test_parse_turn(text, stopped, parsed):
    assert parse_turn(text, stopped) == parsed


@pytest.mark.parametrize("ok, out, err, expected", [
    (True, "10063\n", None, "=10063\n"),
    (False, "", "division by zero", "!division by zero\n"),
    (True, "a\nb", None, "=a b\n"),                                    # one line
    (True, "π≈3", None, "=??3\n"),                                     # printable ASCII only
    (True, "1" * 40, None, "=" + "1" * 24 + "\n"),                     # cut to max chars
])
def test_observation_text(ok, out, err, expected):
    text = observation_text(ok, out, err, 24)
    assert text == expected
    CharTokenizer().encode(text)


@pytest.mark.parametrize("reply, turns, context, action", [
    (Answer("5"), 1, 10, "answer"),
    (Answer("5"), 3, 10, "answer"),           # the last turn may answer
    (Call("calc", "1+1"), 1, 10, "call"),
    (Call("calc", "1+1"), 3, 10, "turn_cap"),  # no turn left to read the observation
    (Malformed("x"), 1, 10, "malformed"),
    (Malformed("x"), 3, 10, "turn_cap"),
    (Call("calc", "1+1"), 1, 80, "length"),    # 80 + 24 + 2 > 100: no room for an observation and a reply
])
def test_next_action(reply, turns, context, action):
    assert next_action(reply, turns, context, LIMITS) == action


def run_scripted(turns: dict[str, list[str]], affinity: str, ranks: int = 2):
    """Drives episodes whose turns are given as text: the 'engine' replies with
    those tokens; tools are the real calculator. Returns (driver, episodes, submitted)."""
    tok = CharTokenizer()
    submitted: list[tuple[int, dict]] = []
    seen: dict[str, tuple[int, int]] = {}
    results: asyncio.Queue = asyncio.Queue()
    calls: list[str] = []

    async def submit(rank, turn):
        submitted.append((rank, turn))
        ep_id, n = turn.id.rsplit("#", 1)
        text = turns[ep_id][int(n)]
        out = tok.encode(text) + ([] if text.endswith("]") else [tok.eos_id])
        # A follow-up turn on the engine that ran the previous one finds the whole
        # blocks (of 4) of the context that engine computed in its prefix cache.
        home, computed = seen.get(ep_id, (None, 0))
        cached = (computed // 4) * 4 if home == rank else 0
        seen[ep_id] = (rank, len(turn.prompt_ids) + len(out))
        await results.put(TurnResult(id=turn.id, output_ids=out, logprobs=[-0.5] * len(out), finish="stop",
                           version=0, cached_tokens=cached, wait_s=0.01 * len(submitted)))

    async def call_tool(tool, argument):
        calls.append(argument)
        return calculate(argument)

    driver = EpisodeDriver(ReactTurns(tok, LIMITS, call_tool), range(ranks), submit, affinity=affinity, capacity=4)
    episodes = [Episode(ep_id, tok.encode("12*34=", add_bos=True), seed=i) for i, ep_id in enumerate(turns)]
    asyncio.run(driver.run(episodes, results.get))
    return driver, episodes, submitted, calls


def test_driver_runs_calls_masks_observations_and_counts_malformed():
    tok = CharTokenizer()
    driver, eps, submitted, calls = run_scripted({
        "good": ["[calc 12*34]", "408"],
        "malformed": ["[calc 12*]", "[sum 1]", "7"],        # a calculator error, then a malformed call
        "capped": ["[calc 1+1]", "[calc 2+2]", "[calc 3+3]"],
        "direct": ["408"]}, affinity="prefer")
    good, bad, capped, direct = eps
    # malformed turns never reach a tool, nor does a call at the turn cap (no turn left to read it)
    assert sorted(calls) == sorted(["12*34", "12*", "1+1", "2+2"])
    assert (good.finish, good.answer, good.turns, good.tool_calls, good.malformed) == ("answer", "408", 2, 1, 0)
    obs = tok.encode("=408\n")
    assert good.response == tok.encode("[calc 12*34]") + obs + tok.encode("408") + [tok.eos_id]
    assert good.mask == [1] * 12 + [0] * len(obs) + [1] * 4
    assert len(good.logprobs) == len(good.response)
    assert (bad.finish, bad.answer, bad.tool_calls, bad.tool_errors, bad.malformed) == ("answer", "7", 1, 1, 1)
    assert tok.decode(bad.response).startswith("[calc 12*]!not an arithmetic")
    assert (capped.finish, capped.turns, capped.tool_calls) == ("turn_cap", 3, 2)
    assert (direct.finish, direct.turns, direct.tool_calls, direct.mask) == ("answer", 1, 0, [1] * 4)
    assert driver.turns == 2 + 3 + 3 + 1 == len(submitted)
    assert driver.max_wait_s == pytest.approx(0.09)
    # tool_count travels with each turn: the queue key orders follow-ups by it
    assert [t.tool_count for _, t in submitted if t.id.startswith("capped")] == [0, 1, 2]
    assert all(n == 0 for n in driver.outstanding.values())


def test_affinity_sends_follow_ups_home_and_saves_reprefill():
    script = {f"e{i}": ["[calc 12*34]", "408"] for i in range(6)}
    pref, eps, sub_pref, _ = run_scripted(script, affinity="prefer")
    first = {t.id.rsplit("#")[0]: r for r, t in sub_pref if t.id.endswith("#0")}
    assert all(r == first[t.id.rsplit("#")[0]] for r, t in sub_pref if t.id.endswith("#1"))
    none, _, sub_none, _ = run_scripted(script, affinity="none")
    assert pref.router.by_reason.get("affinity", 0) == 6
    assert "affinity" not in none.router.by_reason
    # context of a follow-up: bos + prompt + call = 19 tokens; home keeps 16 of them (whole blocks of 4)
    assert pref.reprefill_tokens == 6 * (19 - 16)
    moved = sum(1 for r, t in sub_none if t.id.endswith("#1") and r != first[t.id.rsplit("#")[0]])
    assert none.reprefill_tokens >= pref.reprefill_tokens
    assert none.reprefill_tokens == moved * 19 + (6 - moved) * 3


def test_a_groups_episodes_start_together_and_a_leaving_rank_gets_its_end_and_no_more_turns():
    """ScriptedTurns (the simulator's episodes): a group's first turns go to one rank (its
    prompt is computed once); after leave(), no turn goes to that rank and it has its END."""
    submitted, ended = [], []
    results: asyncio.Queue = asyncio.Queue()
    scripts = {f"g{g}e{i}": [[3, 0.0, 2], [4, 0.0, 0]] for g in range(2) for i in range(3)}
    driver: EpisodeDriver | None = None

    async def submit(rank, turn):
        submitted.append((rank, turn.id))
        if rank == "a" and turn.id.endswith("#0") and "a" in driver.outstanding:
            await driver.leave(["a"])  # released while its first turns run: they finish elsewhere
        n = turn.max_new_tokens
        await results.put(TurnResult(id=turn.id, output_ids=[1] * n, logprobs=[0.0] * n, finish="length",
                           version=0, cached_tokens=0, wait_s=0.0, rank="b" if rank == "a" else rank))

    async def end(rank):
        ended.append(rank)

    driver = EpisodeDriver(ScriptedTurns(scripts, vocab_size=100), ["a", "b", "c"], submit, affinity="prefer",
                           end=end)
    episodes = [Episode(ep, [5, 6, 7], seed=0, group=int(ep[1])) for ep in scripts]

    async def main():
        await driver.run(episodes, results.get)
        await driver.close()
    asyncio.run(main())
    first = {ep: rank for rank, ep in submitted if ep.endswith("#0")}
    assert first["g0e0#0"] == "a" and first["g0e1#0"] == first["g0e2#0"] != "a"  # a left: the group starts anew
    assert all(rank != "a" for rank, ep in submitted[1:])  # nothing after the leave
    assert len({first[f"g1e{i}#0"] for i in range(3)}) == 1  # group 1 started on one rank
    assert ended == ["a", "b", "c"] and driver.routed_to == {}
    assert [(e.turns, e.finish, e.tool_calls, len(e.response)) for e in episodes] == [(2, "answer", 1, 3 + 2 + 4)] * 6
    assert driver.router.by_reason["group"] == 3  # g0e2, g1e1, g1e2 followed their group's first episode


def test_a_rank_that_leaves_after_the_run_closed_gets_no_second_end():
    """A move that releases ranks after every episode is over (the tail of the step's
    stages): close() gave each rank its END; leave() must not add another, which would
    wait in that rank's queue and end its next step before its first turn (the agentic
    run on SGLang that stalled in its second step)."""
    ended = []

    async def end(rank):
        ended.append(rank)

    async def main():
        driver = EpisodeDriver(ScriptedTurns({}, vocab_size=100), ["a", "b", "c"], None, end=end)
        await driver.leave(["a"])  # during the run: its END now
        await driver.close()       # the others' ENDs
        await driver.leave(["b"])  # after: none
        return driver
    driver = asyncio.run(main())
    assert ended == ["a", "b", "c"] and list(driver.outstanding) == ["c"]
