"""An agent for the tests that misbehaves: in each group, episode 0 first sends the
endpoint a wrong token, an oversized body, invalid JSON and a request for a session
that does not exist (each must be refused with its 4xx), then plays one turn;
episode 1 raises after its first turn; episode 2 runs Python in the project's sandbox
(sample.sandbox) and fails unless it printed 42; episode 3 raises in its first attempt
only (agent.on_failure retry plays it again); the others play one turn."""
from collections import Counter

import httpx

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


_attempts: Counter = Counter()


async def play(client, sample):
    _attempts[sample.id] += 1
    if sample.index == 3 and _attempts[sample.id] == 1:
        raise RuntimeError("a first attempt's bad luck")
    url = str(client.base_url).rstrip("/") + "/chat/completions"
    if sample.index == 0:
        good = {"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=60) as http:
            statuses = [
                (await http.post(url, headers={**good, "Authorization": "Bearer wrong"}, content=b"{}")).status_code,
                (await http.post(url, headers=good, content=b"x" * (2 << 20))).status_code,
                (await http.post(url, headers=good, content=b"{not json")).status_code,
                (await http.post(url.replace("/sessions/", "/sessions/nope"), headers=good,
                                 json={"model": "m", "messages": [{"role": "user", "content": "q"}]})).status_code,
            ]
        if statuses != [401, 413, 400, 404]:
            raise AssertionError(f"refusals answered {statuses}")
    response = await client.chat.completions.create(
        model="dynarl", messages=[{"role": "user", "content": sample.prompt}], tools=TOOLS, max_tokens=8)
    if sample.index == 1:
        raise RuntimeError("the agent's own bug")
    if sample.index == 2:
        result = await sample.sandbox.python("print(6 * 7)")
        if not (result.ok and result.stdout.strip() == "42"):
            raise AssertionError(f"the sandbox said {result}")
    return 1.0 if response.choices[0].message.content else 0.0
