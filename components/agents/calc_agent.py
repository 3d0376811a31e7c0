"""The built-in calc task as an agent on the OpenAI API (examples/agent_openai.yaml):
the model is offered one tool, `calc`; a call is evaluated here and its result sent
back as a tool message; the model's text answer is scored against the task's."""
from __future__ import annotations

import json
from typing import Any

from dynarl.components.tasks.calc import calc_score
from dynarl.components.tools.calculator import calculate

TOOLS = [{"type": "function", "function": {
    "name": "calc", "description": "the value of an arithmetic expression",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]
MAX_TURNS = 3


async def play(client: Any, sample: Any) -> float:
    """One episode: up to MAX_TURNS requests; 1 for the exact answer, partial credit for
    a near one, 0 when the model never answers in text."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": sample.prompt}]
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model="dynarl", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        if not message.tool_calls:
            return calc_score(message.content or "", sample.answer)
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": observe(call)})
    return 0.0


def observe(call: Any) -> str:
    """What the tool says to one call: the value, or the error (ASCII: an error quotes
    the model's text, which may hold characters the tiny models cannot read)."""
    if call.function.name != "calc":
        text = f"error: no tool {call.function.name!r}"
    else:
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            return "error: arguments are not JSON"
        result = calculate(arguments.get("x") if isinstance(arguments, dict) else None)
        text = result.stdout if result.ok else f"error: {result.error}"
    return text.encode("ascii", "replace").decode()
