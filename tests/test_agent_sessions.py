NUM_GPUS = 0
"""Token-in/token-out sessions under the episode driver: an agent's requests drive its
episode; the trajectory is the recorded prompt, then exactly the ids each turn produced
and the new messages' ids (masked), never a re-tokenization of old turns."""

import asyncio

import pytest

from dynarl.components.agents.chat_format import ChatFormat
from dynarl.components.agents.messages import (BadRequest, ChatMessage, ChatRequest, CompletionRequest, Sampling,
                                               SessionBusy, ToolCall, ToolSpec, UnknownSession)
from dynarl.components.agents.runner import DROPPED, finish_group, own_groups, reward_of, shared_prefix
from dynarl.components.agents.sessions import Sessions, same_message
from dynarl.components.agents.tool_calls import call_text
from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.workflows.episode import Episode, Limits
from dynarl.components.workflows.episodes import EpisodeDriver
from dynarl.components.workflows.turns import AgentTurns
from dynarl.components.rollout.turn import TurnResult

TOK = CharTokenizer()
FMT = ChatFormat(TOK, "hermes")
TOOLS = (ToolSpec("calc", "value", {"type": "object"}),)
CALL = call_text(ToolCall("x", "calc", '{"x": "2+3"}'), "hermes")


def make(max_turns=3, max_context=400):
    sessions = Sessions(FMT, TOK, Limits(max_turns, 80, max_context), temperature=1.0, tool_parser="hermes")
    return sessions


class Engine:
    """Answers each routed turn from a script of texts (turn k of an episode -> its text);
    records what it was asked. Stands in for the rollout ranks only: the sessions'
    logic under the real EpisodeDriver is what is tested."""

    def __init__(self, script, end=True):
        self.script, self.end = script, end
        self.prompts, self.tool_counts = {}, {}
        self.results = asyncio.Queue()

    async def submit(self, rank, turn):
        ep_id, k = turn.id.rsplit("#", 1)
        self.prompts[turn.id] = list(turn.prompt_ids)
        self.tool_counts[turn.id] = turn.tool_count
        out = TOK.encode(self.script[int(k)]) + ([TOK.eos_id] if self.end else [])
        await self.results.put(TurnResult(id=turn.id, output_ids=out, logprobs=[-0.5] * len(out),
                                finish="stop" if self.end else "length", version=0, cached_tokens=0,
                                wait_s=0.0, rank=rank))


def chat(messages, **sampling):
    return ChatRequest(tuple(messages), TOOLS, sampling=Sampling(**sampling))


async def drive(sessions, engine, agent):
    ep = Episode("e0", [], 7, group=0)
    session = sessions.open(ep)
    driver = EpisodeDriver(AgentTurns(sessions), ["r0"], engine.submit)

    async def play():
        try:
            reward = await agent(session.id)
        except Exception as exc:
            sessions.finish(session, failure=type(exc).__name__)
            return
        sessions.finish(session, reward)
    agent_task = asyncio.ensure_future(play())
    await asyncio.wait_for(driver.run([ep], engine.results.get), 30)
    await agent_task
    return ep, session, driver


@pytest.mark.asyncio
async def test_a_two_turn_tool_episode_trains_the_recorded_ids_and_masks_the_new_messages():
    sessions, engine = make(), Engine([CALL, "5"])
    user = ChatMessage("user", "2+3=")
    seen = []

    async def agent(sid):
        first = await sessions.chat(sid, chat([user]))
        seen.append(first)
        assert first.finish_reason == "tool_calls" and first.tool_calls[0].name == "calc"
        assistant = ChatMessage("assistant", first.text, first.tool_calls)
        tool = ChatMessage("tool", "5", tool_call_id=first.tool_calls[0].id)
        second = await sessions.chat(sid, chat([user, assistant, tool]))
        seen.append(second)
        assert second.text == "5" and second.finish_reason == "stop"
        return 1.0

    ep, session, _ = await drive(sessions, engine, agent)
    prompt = FMT.render([user], TOOLS, True)
    turn0 = TOK.encode(CALL) + [TOK.eos_id]
    new = FMT.continuation([user, ChatMessage("assistant", "", seen[0].tool_calls)],
                           [ChatMessage("tool", "5", tool_call_id="call_0_0")], TOOLS, True)
    turn1 = TOK.encode("5") + [TOK.eos_id]
    assert ep.prompt_ids == prompt == engine.prompts["e0#0"]
    assert engine.prompts["e0#1"] == prompt + turn0 + new  # the recorded ids plus the new ones
    assert ep.response == turn0 + new + turn1
    assert ep.mask == [1] * len(turn0) + [0] * len(new) + [1] * len(turn1)
    assert ep.logprobs == [-0.5] * len(turn0) + [0.0] * len(new) + [-0.5] * len(turn1)
    assert list(seen[0].token_ids) == turn0 and list(seen[1].token_ids) == turn1
    assert ep.finish == "answer" and session.reward == 1.0 and ep.turns == 2
    assert dict(sessions.calls_by_tool) == {"calc": 1}
    assert engine.tool_counts == {"e0#0": 0, "e0#1": 1}  # the priority's tool_count: the session's turns so far


@pytest.mark.asyncio
async def test_a_turn_cut_at_its_length_gets_the_end_id_masked_before_the_next_messages():
    sessions, engine = make(), Engine(["ab", "cd"], end=False)
    user = ChatMessage("user", "q")

    async def agent(sid):
        first = await sessions.chat(sid, chat([user]))
        assert first.finish_reason == "length"
        await sessions.chat(sid, chat([user, ChatMessage("assistant", first.text), ChatMessage("user", "more")]))
        return 0.5

    ep, _, _ = await drive(sessions, engine, agent)
    after = ep.response[2:]
    assert after[0] == TOK.eos_id and ep.mask[2] == 0  # the end the model did not produce, masked
    assert TOK.decode(after[1:]).startswith("U:more")


@pytest.mark.asyncio
async def test_a_request_that_rewrites_the_conversation_is_refused_and_the_episode_goes_on():
    sessions, engine = make(), Engine(["hi", "ok"])
    user = ChatMessage("user", "q")

    async def agent(sid):
        first = await sessions.chat(sid, chat([user]))
        with pytest.raises(BadRequest, match="do not extend"):
            await sessions.chat(sid, chat([ChatMessage("user", "other"), ChatMessage("assistant", first.text),
                                           ChatMessage("user", "x")]))
        with pytest.raises(BadRequest, match="temperature"):
            await sessions.chat(sid, chat([user, ChatMessage("assistant", first.text), ChatMessage("user", "x")],
                                          temperature=0.2))
        second = await sessions.chat(sid, chat([user, ChatMessage("assistant", first.text), ChatMessage("user", "x")]))
        return 1.0 if second.text == "ok" else 0.0

    ep, session, _ = await drive(sessions, engine, agent)
    assert session.reward == 1.0 and ep.turns == 2
    assert sessions.counters["diverged"] == 1 and sessions.counters["bad_request"] == 1


@pytest.mark.asyncio
async def test_unknown_busy_and_over_long_requests_are_refused():
    sessions = make(max_context=30)
    with pytest.raises(UnknownSession):
        await sessions.chat("nope", chat([ChatMessage("user", "q")]))
    ep = Episode("e1", [], 1, group=0)
    session = sessions.open(ep)
    with pytest.raises(BadRequest, match="tokens; the model takes 30"):
        await sessions.chat(session.id, chat([ChatMessage("user", "q" * 40)]))
    with pytest.raises(BadRequest, match="^n:"):
        await sessions.chat(session.id, chat([ChatMessage("user", "q")], n=2))
    pending = asyncio.ensure_future(sessions.chat(session.id, chat([ChatMessage("user", "q")])))
    await asyncio.sleep(0)
    with pytest.raises(SessionBusy):
        await sessions.chat(session.id, chat([ChatMessage("user", "q")]))
    sessions.finish(session, failure="RuntimeError")
    pending.cancel()
    with pytest.raises(UnknownSession):  # over: its session answers no more
        await sessions.chat(session.id, chat([ChatMessage("user", "q")]))
    assert sessions.counters["unknown_session"] == 2 and sessions.counters["busy"] == 1
    assert sessions.counters["failures"] == 1


@pytest.mark.asyncio
async def test_an_agent_that_raises_mid_episode_ends_it_failed():
    sessions, engine = make(), Engine(["a", "b"])

    async def agent(sid):
        await sessions.chat(sid, chat([ChatMessage("user", "q")]))
        raise RuntimeError("tool crashed")

    ep, session, _ = await drive(sessions, engine, agent)
    assert ep.finish == "failed" and session.failure == "RuntimeError" and ep.turns == 1


@pytest.mark.asyncio
async def test_an_agent_that_never_asks_ends_its_episode_without_a_turn():
    sessions, engine = make(), Engine([])

    async def agent(sid):
        raise ValueError("no")

    ep, session, driver = await drive(sessions, engine, agent)
    assert ep.turns == 0 and ep.response == [] and driver.finished == [ep]


@pytest.mark.asyncio
async def test_completions_extend_the_transcript_or_the_recorded_token_ids():
    sessions, engine = make(), Engine(["xy", "z", "w"])

    async def agent(sid):
        first = await sessions.complete(sid, CompletionRequest("1+1="))
        assert first.text == "xy"
        with pytest.raises(BadRequest, match="does not extend"):
            await sessions.complete(sid, CompletionRequest("2+2=" + first.text))
        second = await sessions.complete(sid, CompletionRequest("1+1=" + first.text + "?"))  # the agent's own text
        with pytest.raises(BadRequest, match="must be < 103"):
            await sessions.complete(sid, CompletionRequest(tuple(engine.prompts["e0#1"]) + (500,)))
        context = tuple(engine.prompts["e0#1"]) + tuple(second.token_ids)
        await sessions.complete(sid, CompletionRequest(context + (TOK.encode("!")[0],)))
        with pytest.raises(BadRequest, match="go on with token ids"):
            await sessions.complete(sid, CompletionRequest("1+1=xyz!"))
        return 1.0

    ep, _, _ = await drive(sessions, engine, agent)
    assert ep.prompt_ids == TOK.encode("1+1=")
    assert engine.prompts["e0#1"] == TOK.encode("1+1=xy") + [TOK.eos_id] + TOK.encode("?")
    assert engine.prompts["e0#2"] == engine.prompts["e0#1"] + TOK.encode("z") + [TOK.eos_id] + TOK.encode("!")


@pytest.mark.asyncio
async def test_a_resent_request_gets_the_recorded_reply_and_the_episode_goes_on():
    """An agent whose client gave up waiting sends the same messages again: it is
    answered with the reply the session recorded, nothing is generated twice."""
    sessions, engine = make(), Engine(["hi", "ok"])
    user = ChatMessage("user", "q")

    async def agent(sid):
        first = await sessions.chat(sid, chat([user]))
        again = await sessions.chat(sid, chat([user]))
        assert again is first
        second = await sessions.chat(sid, chat([user, ChatMessage("assistant", first.text), ChatMessage("user", "x")]))
        return 1.0 if second.text == "ok" else 0.0

    ep, session, _ = await drive(sessions, engine, agent)
    assert session.reward == 1.0 and ep.turns == 2 and len(engine.prompts) == 2
    assert sessions.counters["resent"] == 1


@pytest.mark.asyncio
async def test_what_the_run_cannot_honour_is_refused_and_a_refused_first_request_fixes_nothing():
    sessions = make(max_context=30)
    session = sessions.open(Episode("e3", [], 1, group=0))
    with pytest.raises(BadRequest, match="tool_choice 'required'"):
        await sessions.chat(session.id, ChatRequest((ChatMessage("user", "q"),), TOOLS, tool_choice="required"))
    with pytest.raises(BadRequest, match="top_p"):
        await sessions.chat(session.id, chat([ChatMessage("user", "q")], top_p=0.5))
    with pytest.raises(BadRequest, match="the model takes 30"):
        await sessions.chat(session.id, chat([ChatMessage("user", "q" * 40)]))
    assert session.kind == "" and not session.started.done()  # a completion may still open it
    sessions.finish(session, failure="cancelled")
    assert sessions.counters["failures"] == 0  # (its step ended: not the agent's failure)


@pytest.mark.parametrize("a, b, same", [
    (ChatMessage("assistant", "", (ToolCall("1", "f", '{"a": 1, "b": 2}'),)),
     ChatMessage("assistant", "", (ToolCall("1", "f", '{"b":2,"a":1}'),)), True),
    (ChatMessage("assistant", "x"), ChatMessage("assistant", "y"), False),
    (ChatMessage("assistant", "", (ToolCall("1", "f", "{}"),)), ChatMessage("assistant", ""), False),
    (ChatMessage("tool", "5", tool_call_id="a"), ChatMessage("tool", "5", tool_call_id="b"), False),
    (ChatMessage("user", "q"), ChatMessage("system", "q"), False),
])
def test_same_message(a, b, same):
    assert same_message(a, b) is same


@pytest.mark.parametrize("result, reward, scores", [
    (1, 1.0, {}), (0.25, 0.25, {}), ({"reward": 0.5, "format": 1.0}, 0.5, {"format": 1.0}),
])
def test_reward_of(result, reward, scores):
    assert reward_of(result) == (reward, scores)


@pytest.mark.parametrize("bad", [True, "1", {"score": 1.0}, float("nan"), None])
def test_reward_of_refuses(bad):
    with pytest.raises(ValueError):
        reward_of(bad)


def test_a_groups_prompt_is_what_its_prompts_share_not_its_responses():
    """Every episode's response may begin alike (the same call): the group's prompt
    still ends where its prompts do, so each mask fits its tokens."""
    a = Episode("a", [1, 5], 0, response=[7, 8, 2], mask=[1, 1, 1], logprobs=[-1.0] * 3, group=0)
    b = Episode("b", [1, 5], 0, response=[7, 8, 9, 2], mask=[1, 1, 1, 1], logprobs=[-1.0] * 4, group=0)
    group = PromptGroup(0, "p", "", [1], [Sample(x, 0) for x in "ab"])
    finish_group(group, [a, b], [False, False], [1.0, 0.0], end_id=2, eps=1e-6)
    assert group.prompt_ids == [1, 5]
    for sample, ep in zip(group.samples, (a, b)):
        assert list(sample.output_ids) == ep.response and sample.mask == ep.mask


def test_a_group_trains_its_shared_prompt_and_drops_a_failed_episode():
    a = Episode("a", [1, 5, 6], 0, response=[7, 2], mask=[1, 1], logprobs=[-1.0, -1.0], group=0)
    b = Episode("b", [1, 5, 9], 0, response=[8, 2], mask=[1, 1], logprobs=[-2.0, -2.0], group=0)
    c = Episode("c", [1, 5, 6], 0, response=[7], mask=[1], logprobs=[-1.0], group=0)
    group = PromptGroup(0, "p", "", [1, 3], [Sample(x, 0) for x in "abc"])
    finish_group(group, [a, b, c], [False, False, True], [1.0, 0.0, 1.0], end_id=2, eps=1e-6)
    assert group.prompt_ids == [1, 5] == shared_prefix([a.prompt_ids, b.prompt_ids])
    sa, sb, sc = group.samples
    assert list(sa.output_ids) == [6, 7, 2] and sa.mask == [0, 1, 1] and sa.logprobs == [0.0, -1.0, -1.0]
    assert sa.advantage > 0 > sb.advantage
    assert list(sc.output_ids) == [2] and sc.mask == [0] and sc.advantage == 0.0 and sc.reward == 0.0


@pytest.mark.asyncio
async def test_a_request_waiting_when_its_step_ends_is_answered_at_once():
    sessions = make()
    session = sessions.open(Episode("e2", [], 1, group=0))
    pending = asyncio.ensure_future(sessions.chat(session.id, chat([ChatMessage("user", "q")])))
    await asyncio.sleep(0)
    assert not pending.done()
    sessions.close(session)
    with pytest.raises(UnknownSession, match="ended before its turn"):
        await asyncio.wait_for(pending, 5)


def test_a_dropped_episode_is_a_group_of_its_own_for_the_trainer():
    """The trainer computes advantages from rewards by group: a dropped episode's 0
    must not make its group's three successes look better than average."""
    import torch
    from dynarl.components.trainer.native.losses import grpo_advantages
    assert own_groups([0, 0, 0, 0, 1, 1], ["answer", DROPPED, "answer", "answer", DROPPED, "answer"]) == \
        [0, 3, 0, 0, 6, 1]
    ids = own_groups([0, 0, 0, 0], ["answer", "answer", "answer", DROPPED])
    adv = grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor(ids))
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 0])).tolist()[0] > 0  # (before)
