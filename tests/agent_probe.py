"""An agent for the tests, written with the official openai package: it offers the
calc tool, plays two turns or more (the tool's answer when the model calls it, else
a follow-up question), asks for log-probs, and writes what each turn's response held
(its tokens' texts) to $AGENT_PROBE_DIR/<episode>.json, so a test can check that the
trained ids are exactly those."""
import json
import os

from dynarl.components.agents.calc_agent import TOOLS, observe
from dynarl.components.tasks.calc import calc_score


async def play(client, sample):
    messages = [{"role": "system", "content": "use calc"}, {"role": "user", "content": sample.prompt}]
    turns = []
    for k in range(2):
        response = await client.chat.completions.create(model="dynarl", messages=messages, tools=TOOLS,
                                                        logprobs=True, max_tokens=24)
        choice = response.choices[0]
        turns.append({"tokens": [t.token for t in choice.logprobs.content],
                      "logprobs": [t.logprob for t in choice.logprobs.content],
                      "finish": choice.finish_reason, "calls": len(choice.message.tool_calls or ())})
        messages.append(choice.message.model_dump(exclude_none=True))
        if choice.message.tool_calls:
            for call in choice.message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": observe(call)})
        elif k == 0:
            messages.append({"role": "user", "content": "sure?"})
    with open(os.path.join(os.environ["AGENT_PROBE_DIR"], f"{sample.id.replace('/', '_')}.json"), "w") as f:
        json.dump(turns, f)
    return {"reward": calc_score(messages[-1].get("content") or "", sample.answer), "turns": float(len(turns))}
