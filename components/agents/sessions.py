"""Token-in/token-out sessions: one per episode an agent plays.

An agent's requests drive its episode (the EpisodeDriver's `AgentTurns`, turns.py):

    first request      its messages rendered by the chat format -> the episode's prompt ids
    each turn          routed to a rollout rank like any agentic turn; the engine's ids,
                       log-probs and end are recorded (the trajectory trained is exactly them)
    a later request    its messages must extend the conversation the session recorded
                       (the last request's messages, then the assistant reply it was given);
                       only the new messages are rendered, after the recorded ids
                       (chat_format.continuation), masked out of the loss; old turns are
                       never tokenized again
    the agent returns  the episode is over, with the agent's reward

A request that does not fit (a conversation that does not extend the recorded one,
a prompt past the model's context, a turn past agentic.max_turns) is refused with
400 and the episode waits for the agent's next request or its end.
"""
from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from dynarl.components.agents.chat_format import ChatFormat
from dynarl.components.agents.messages import (BadRequest, ChatMessage, ChatRequest, CompletionRequest,
                                               SessionBusy, ToolCall, TurnOutput, UnknownSession)
from dynarl.components.agents.tool_calls import Parser, parse_reply
from dynarl.components.model.spec import safe_decode
from dynarl.components.workflows.episode import Episode, Limits


@dataclass(slots=True)
class Session:
    """One episode's conversation as recorded."""
    id: str
    episode: Episode
    history: list[ChatMessage] = field(default_factory=list)
    """The last chat request's messages and the assistant reply it was given."""
    started: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """True at the first request; False if the agent ended before making one."""
    next_prompt: asyncio.Future | None = None
    """While the episode waits between turns: the next request's new ids (None: the agent is done)."""
    output: asyncio.Future | None = None
    """While a request waits for its turn: the turn's TurnOutput."""
    max_tokens: int | None = None
    ended: bool = True
    """The last turn's ids end with the chat format's end id."""
    done: bool = False
    reward: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
    failure: str = ""
    """Why the agent failed (an exception, a timeout), or ""."""
    kind: str = ""
    """'chat' or 'completion': a session speaks one of them."""
    last_output: TurnOutput | None = None
    """The reply to the last chat request (a resent request gets it again)."""
    transcript: str | None = ""
    """Text completions: the text so far as the agent sees it (None once token ids were sent)."""


class Sessions:
    """The live sessions of a step's agent episodes, and the endpoint's backend: the
    HTTP server (server.py) calls `chat` and `complete`."""

    def __init__(self, fmt: ChatFormat, tokenizer: Any, limits: Limits, temperature: float,
                 tool_parser: Parser, *, top_p: float = 1.0, vocab_size: int | None = None) -> None:
        """`temperature`, `top_p`: the run's sampling (rollout.*), which a request may not
        change; `vocab_size`: the model's (token ids beyond it are refused)."""
        self.fmt, self.tokenizer, self.limits = fmt, tokenizer, limits
        self.temperature, self.top_p, self.tool_parser = temperature, top_p, tool_parser
        self.vocab_size = tokenizer.vocab_size if vocab_size is None else vocab_size
        self.by_id: dict[str, Session] = {}
        self.by_episode: dict[str, Session] = {}
        self.counters: Counter[str] = Counter()
        """refused requests by reason, malformed tool calls, agent failures."""
        self.calls_by_tool: Counter[str] = Counter()

    # --- episodes ---------------------------------------------------------------------
    def open(self, episode: Episode) -> Session:
        session = Session(secrets.token_hex(12), episode)
        self.by_id[session.id] = session
        self.by_episode[episode.id] = session
        return session

    def close(self, session: Session) -> None:
        """The session is gone (its step is over): a request still waiting for its turn
        is answered 404 at once, not left to the server's stop."""
        self.by_id.pop(session.id, None)
        self.by_episode.pop(session.episode.id, None)
        session.done = True
        if session.output is not None and not session.output.done():
            session.output.set_exception(UnknownSession("the episode ended before its turn did (its step is over)"))

    def finish(self, session: Session, reward: float = 0.0, scores: dict[str, float] | None = None,
               failure: str = "") -> None:
        """The agent returned (or failed): the episode ends at its next boundary."""
        session.done, session.reward, session.scores, session.failure = True, reward, dict(scores or {}), failure
        if failure and failure != "cancelled":  # (cancelled: its step ended for another reason)
            self.counters["failures"] += 1
        if not session.started.done():
            session.started.set_result(False)
        if session.next_prompt is not None and not session.next_prompt.done():
            session.next_prompt.set_result(None)

    # --- the endpoint's backend ---------------------------------------------------------
    async def chat(self, session_id: str, request: ChatRequest) -> TurnOutput:
        session = self._take(session_id, "chat", request.sampling)
        if request.tool_choice not in ("auto", "none"):
            raise self._refuse("bad_request", f"tool_choice {request.tool_choice!r}: the turn is sampled freely "
                               f"(no constrained decoding); use 'auto'", "tool_choice")
        try:
            messages = list(request.messages)
            if not session.started.done():
                prompt = self._render(lambda: self.fmt.render(messages, request.tools, True))
                self._fits(session, len(prompt))
                session.episode.prompt_ids, session.kind = prompt, "chat"
                session.max_tokens = request.sampling.max_tokens
                return await self._turn(session, lambda: session.started.set_result(True), messages, request)
            if self._resent(session, messages):
                assert session.last_output is not None
                return session.last_output
            new = self._extension(session, messages)
            ids = self._render(lambda: self.fmt.continuation(bare(session.history), new, request.tools,
                                                             session.ended))
            return await self._next(session, ids, messages, request)
        finally:
            session.output = None

    async def complete(self, session_id: str, request: CompletionRequest) -> TurnOutput:
        """A text prompt must extend the session's transcript (its first prompt, then each
        text it was answered, then what the agent added); token ids must extend the
        recorded ids. The new part alone is tokenized."""
        session = self._take(session_id, "completion", request.sampling)
        started = session.started.done()
        try:
            text: str | None = None
            if isinstance(request.prompt, str):
                text = request.prompt
                if session.transcript is None:
                    raise self._refuse("bad_request", "prompt: this session sent token ids; go on with token ids",
                                       "prompt")
                if started and not text.startswith(session.transcript):
                    raise self._refuse("diverged", "prompt: does not extend the session's text so far", "prompt")
                new = self._render(lambda: self.tokenizer.encode(text[len(session.transcript or ""):]
                                                                 if started else text))
            else:
                prompt_ids = list(request.prompt)
                if any(i >= self.vocab_size for i in prompt_ids):
                    raise self._refuse("bad_request", f"prompt: token ids must be < {self.vocab_size} (the model's "
                                       f"vocabulary)", "prompt")
                recorded_ids = session.episode.context if started else []
                if prompt_ids[:len(recorded_ids)] != recorded_ids:
                    raise self._refuse("diverged", "prompt: does not extend the session's token ids so far", "prompt")
                new = prompt_ids[len(recorded_ids):]
            if not started:
                if not new:
                    raise self._refuse("bad_request", "prompt: empty", "prompt")
                self._fits(session, len(new))
                session.episode.prompt_ids, session.kind = new, "completion"
                session.max_tokens = request.sampling.max_tokens
                output = await self._turn(session, lambda: session.started.set_result(True), None, None)
            else:
                output = await self._next(session, new, None, None)
            session.transcript = None if text is None else text + output.text
            return output
        finally:
            session.output = None

    # --- what AgentTurns (turns.py) calls ------------------------------------------------
    def budget(self, ep: Episode) -> int:
        session = self.by_episode[ep.id]
        cap = min(self.limits.max_new_tokens, self.limits.max_context - len(ep.context))
        return max(1, min(cap, session.max_tokens or cap))

    async def turn_done(self, ep: Episode, out: list[int], finish: str) -> list[int] | None:
        """A turn's result is in: the waiting request gets it; then the new ids of the
        agent's next request, or None once the agent is done."""
        session = self.by_episode[ep.id]
        session.ended = bool(out) and out[-1] == self.fmt.end_id
        logprobs = ep.logprobs[len(ep.logprobs) - len(out):]
        output = self._output(session, out, logprobs, finish, len(ep.context) - len(out))
        if session.output is not None and not session.output.done():
            session.output.set_result(output)
        if session.done:
            return None
        session.next_prompt = asyncio.get_running_loop().create_future()
        return await session.next_prompt

    # --- the parts ---------------------------------------------------------------------
    def _take(self, session_id: str, kind: str, sampling: Any) -> Session:
        session = self.by_id.get(session_id)
        if session is None or session.done:
            self.counters["unknown_session"] += 1
            raise UnknownSession(f"no session {session_id!r} (its episode is over, or it never was)")
        if session.output is not None or (session.started.done() and session.next_prompt is None):
            self.counters["busy"] += 1
            raise SessionBusy("this session has a request under way: an episode is one conversation")
        if session.kind and session.kind != kind:  # (set once its first request is accepted)
            raise self._refuse("bad_request", f"this session speaks {session.kind} requests, not {kind}")
        if sampling.n != 1:
            raise self._refuse("bad_request", "n: an episode is one trajectory; the run's "
                               "rollout.samples_per_prompt episodes make the group", "n")
        if sampling.top_logprobs:
            raise self._refuse("bad_request", "top_logprobs: the engines report the sampled token's only",
                               "top_logprobs")
        if sampling.stop:
            raise self._refuse("bad_request", "stop: not supported in training (the trajectory is the "
                               "engine's tokens to its end token)", "stop")
        if sampling.temperature is not None and abs(sampling.temperature - self.temperature) > 1e-6:
            raise self._refuse("bad_request", f"temperature: the run samples at rollout.temperature "
                               f"{self.temperature}", "temperature")
        if session.episode.turns >= self.limits.max_turns and session.started.done():
            raise self._refuse("turn_cap", f"the episode has had its agentic.max_turns {self.limits.max_turns} turns")
        if sampling.top_p is not None and abs(sampling.top_p - self.top_p) > 1e-6:
            raise self._refuse("bad_request", f"top_p: the run samples at rollout.top_p {self.top_p}", "top_p")
        return session

    def _refuse(self, reason: str, message: str, param: str | None = None) -> BadRequest:
        self.counters[reason] += 1
        return BadRequest(message, param)

    def _render(self, make: Any) -> list[int]:
        try:
            return list(make())
        except ValueError as exc:
            raise self._refuse("bad_request", f"messages: {exc}", "messages") from None

    def _fits(self, session: Session, more: int) -> None:
        size = len(session.episode.context) + more if session.started.done() else more
        if size + 1 > self.limits.max_context:
            raise self._refuse("too_long", f"the prompt is {size} tokens; the model takes "
                               f"{self.limits.max_context} with at least one generated", "messages")

    def _resent(self, session: Session, messages: list[ChatMessage]) -> bool:
        """The last request again (its client gave up waiting, or retried): it is answered
        with the reply the session recorded for it, not generated again."""
        last = session.history[:-1]
        if session.last_output is None or len(messages) != len(last) or \
                any(not same_message(a, b) for a, b in zip(messages, last)):
            return False
        self.counters["resent"] += 1
        return True

    def _extension(self, session: Session, messages: list[ChatMessage]) -> list[ChatMessage]:
        """The messages after the recorded conversation; refused unless they extend it."""
        k = len(session.history)
        if len(messages) <= k or any(not same_message(a, b) for a, b in zip(messages, session.history)):
            raise self._refuse("diverged", "messages: do not extend the session's conversation (the last "
                               "request's messages, then the reply it was given)", "messages")
        return messages[k:]

    async def _next(self, session: Session, ids: list[int], messages: list[ChatMessage] | None,
                    request: ChatRequest | None) -> TurnOutput:
        self._fits(session, len(ids))
        session.max_tokens = (request.sampling.max_tokens if request is not None else None)
        waiting = session.next_prompt
        assert waiting is not None  # (_take refused a follow-up before the episode waits for one)
        session.next_prompt = None
        return await self._turn(session, lambda: waiting.set_result(ids), messages, request)

    async def _turn(self, session: Session, release: Any, messages: list[ChatMessage] | None,
                    request: ChatRequest | None) -> TurnOutput:
        session.output = asyncio.get_running_loop().create_future()
        release()
        output: TurnOutput = await session.output
        if messages is not None and request is not None:
            if request.tool_choice == "none" and output.tool_calls:
                output = TurnOutput(self._text(output), (), _finish(output.finish_reason, ()), output.token_ids,
                                    output.logprobs, output.tokens, output.prompt_tokens)
            session.history = messages + [ChatMessage("assistant", output.text, output.tool_calls)]
            session.last_output = output
        return output

    def _output(self, session: Session, out: list[int], logprobs: list[float], finish: str,
                prompt_tokens: int) -> TurnOutput:
        body = out[:-1] if session.ended else out
        text = safe_decode(self.tokenizer, body)
        calls: tuple[ToolCall, ...] = ()
        if session.kind == "chat":
            parsed = parse_reply(text, self.tool_parser, id_prefix=f"call_{session.episode.turns}")
            if parsed.malformed is not None:
                self.counters["malformed_tool_calls"] += 1
            text, calls = parsed.content, parsed.calls
            if calls:
                session.episode.tool_calls += 1
                self.calls_by_tool.update(call.name for call in calls)
        tokens = tuple(token_text(self.tokenizer, i) for i in out)
        return TurnOutput(text, calls, _finish(finish, calls), tuple(out), tuple(logprobs), tokens, prompt_tokens)

    def _text(self, output: TurnOutput) -> str:
        return safe_decode(self.tokenizer, [i for i in output.token_ids if i != self.fmt.end_id])


def _finish(engine_finish: str, calls: Sequence[ToolCall]) -> Any:
    if calls:
        return "tool_calls"
    return "length" if engine_finish == "length" else "stop"


def token_text(tokenizer: Any, token_id: int) -> str:
    """One id's text for a response's log-probs; an id the tokenizer does not know (the
    model's vocabulary is padded) as "token_id:<id>", vLLM's form for ids."""
    if token_id >= tokenizer.vocab_size:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special=False)


def bare(history: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The recorded conversation with the model's own text left out (its turns keep
    only how many calls they made): continuation renders it only to count its turns,
    and the model's text need not be renderable (an id the tokenizer does not know)."""
    return [m if m.role != "assistant" else
            ChatMessage("assistant", "", tuple(ToolCall(c.id, "call", "{}") for c in m.tool_calls))
            for m in history]


def same_message(a: ChatMessage, b: ChatMessage) -> bool:
    """Whether a message the agent sent back is the one recorded: role, text, and its
    tool calls by name and parsed arguments (clients re-serialise JSON their own way)."""
    if a.role != b.role or (a.content or "") != (b.content or "") or len(a.tool_calls) != len(b.tool_calls):
        return False
    if a.role == "tool" and a.tool_call_id != b.tool_call_id:
        return False
    for x, y in zip(a.tool_calls, b.tool_calls):
        if x.name != y.name or _json(x.arguments) != _json(y.arguments):
            return False
    return True


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
