"""A conversation as token ids: the first prompt of a session, and the ids that follow a
recorded conversation when the agent sends its next request.

Token in, token out: the ids the model produced are what is trained, so a turn is never
re-tokenized. After the first request only the new messages' ids are appended
(`continuation`), cut out of a full rendering of the conversation.

- CharTokenizer (the built-in tiny models) has no template; a compact format of our own:
  [bos], "S:tools a,b\\n" when tools are offered, then "S:"/"U:"/"T:" + content + "\\n"
  for system/user/tool messages and "A:" + content + the calls + eos for the assistant's;
  the generation prompt is "A:".
- HFTokenizer: the model's chat template with OpenAI-style message and tool dicts."""
from __future__ import annotations

from typing import Sequence

from dynarl.components.agents.messages import ChatMessage, ToolSpec
from dynarl.components.agents.tool_calls import Parser, call_arguments, call_text
from dynarl.components.model.tokenizer import CharTokenizer, HFTokenizer

_TINY_PREFIX = {"system": "S:", "user": "U:", "tool": "T:"}
TINY_ASSISTANT = "A:"


class ChatFormat:
    def __init__(self, tokenizer: CharTokenizer | HFTokenizer, parser: Parser):
        if tokenizer.eos_id is None:
            raise ValueError("the tokenizer has no eos token to end an assistant turn")
        self.tokenizer = tokenizer
        self.parser = parser
        self.end_id: int = tokenizer.eos_id
        """The id that ends an assistant turn (Qwen: <|im_end|>)."""

    def render(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = (),
               add_generation_prompt: bool = True) -> list[int]:
        """The whole conversation's ids, with the assistant's turn opened when asked."""
        if isinstance(self.tokenizer, CharTokenizer):
            return self._render_tiny(messages, tools, add_generation_prompt)
        text = self.tokenizer.render_chat([_openai_message(m) for m in messages],
                                          [_openai_tool(t) for t in tools] or None, add_generation_prompt)
        return self.tokenizer.encode(text)

    def first_prompt(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> list[int]:
        return self.render(messages, tools, True)

    def continuation(self, history: Sequence[ChatMessage], new: Sequence[ChatMessage],
                     tools: Sequence[ToolSpec], ended: bool) -> list[int]:
        """The ids that follow a recorded conversation: `history` ends with the assistant
        turn the model produced, whose recorded ids end with end_id iff `ended`. The cut
        is found by counting end ids, not by matching a prefix, so a template that
        re-renders older turns differently (Qwen3 drops their <think>) still cuts right.
        Not ended: the end id the model did not produce comes first (masked later)."""
        if not history or history[-1].role != "assistant":
            raise ValueError("history must end with the assistant's turn")
        turns = self.render(history, tools, False).count(self.end_id)
        full = self.render([*history, *new], tools, True)
        ends = [i for i, t in enumerate(full) if t == self.end_id]
        if turns == 0 or len(ends) < turns:
            raise ValueError(f"the rendered conversation has {len(ends)} end ids where the history "
                             f"has {turns}: the chat template does not end each turn with end_id {self.end_id}")
        return full[ends[turns - 1] + (1 if ended else 0):]

    def _render_tiny(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec],
                     add_generation_prompt: bool) -> list[int]:
        encode = self.tokenizer.encode
        ids: list[int] = [CharTokenizer.bos_id]
        if tools:
            ids += encode("S:tools " + ",".join(t.name for t in tools) + "\n")
        for m in messages:
            if m.role == "assistant":
                calls = "".join(call_text(c, self.parser) for c in m.tool_calls)
                ids += [*encode(TINY_ASSISTANT + m.content + calls), self.end_id]
            elif m.role in _TINY_PREFIX:
                ids += encode(_TINY_PREFIX[m.role] + m.content + "\n")
            else:
                raise ValueError(f"message role {m.role!r} is not one of system, user, assistant, tool")
        if add_generation_prompt:
            ids += encode(TINY_ASSISTANT)
        return ids


def _openai_message(m: ChatMessage) -> dict:
    """A message as chat templates read it: assistant calls' arguments parsed (Qwen's
    template writes them with tojson)."""
    out: dict = {"role": m.role, "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": call_arguments(c)}} for c in m.tool_calls]
    if m.role == "tool":
        if m.tool_call_id:
            out["tool_call_id"] = m.tool_call_id
        if m.name:
            out["name"] = m.name
    return out


def _openai_tool(t: ToolSpec) -> dict:
    return {"type": "function", "function": {"name": t.name, "description": t.description,
                                             "parameters": t.parameters}}
