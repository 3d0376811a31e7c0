"""An agent for the tests, written with the official openai package: it offers the
calc tool, plays two turns or more (the tool's answer when the model calls it, else
a follow-up question), asks for log-probs, and writes what each turn's response held
(its tokens' texts) to $AGENT_PROBE_DIR/<episode>.json, so a test can check that the
trained ids are exactly those."""
import json
import os
import zlib

import numpy as np

from dynarl.components.agents.calc_agent import TOOLS, observe
from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.tasks.calc import calc_score
from dynarl.components.workflows.ledger import read_entries

ARGS = ["agentic.episodes=agent", "agent.function=agent_probe:play", "run.save_samples=true"]
"""`dynarl train` arguments (with the calc task and workflow agentic) that run this agent."""


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


def probe_env(folder):
    """The environment a run with this agent needs: where it writes, and tests/ importable."""
    tests = os.path.dirname(os.path.abspath(__file__))
    return {"AGENT_PROBE_DIR": str(folder), "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}


def token_ids(texts):
    """A response's tokens (their log-probs' texts, the char tokenizer's) as ids."""
    tok = CharTokenizer()
    specials = {"<pad>": tok.pad_id, "<bos>": tok.bos_id, "<eos>": tok.eos_id}
    return [specials[t] if t in specials else int(t[len("token_id:"):]) if t.startswith("token_id:")
            else tok.encode(t)[0] for t in texts]


def runs_of_ones(mask, ids):
    """The runs of ids where mask is 1, in order."""
    out, current = [], []
    for m, x in zip(mask, ids):
        if m:
            current.append(x)
        elif current:
            out.append(current)
            current = []
    return out + ([current] if current else [])


def trained_exactly_what_the_engine_produced(run, probe) -> int:
    """Each trained sample (samples.jsonl) against what its agent was answered: the runs
    of the loss mask are exactly each turn's ids, and the ledger digests those samples.
    Returns how many samples were checked."""
    steps = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    entries = read_entries(str(run / "ledger.jsonl"))
    assert [s["step"] for s in steps] == [e.step for e in entries]
    seen = 0
    for saved, entry in zip(steps, entries):
        assert [s["id"] for s in saved["samples"]] == list(entry.sample_ids)
        for sample, digest in zip(saved["samples"], entry.digests):
            output = sample["input_ids"][sample["prompt_len"]:]
            assert zlib.crc32(np.asarray(output, dtype=np.int64).tobytes()) == digest
            assert len(sample["mask"]) == len(output)
            turns = json.loads((probe / f"{sample['id'].replace('/', '_')}.json").read_text())
            assert len(turns) >= 2
            assert runs_of_ones(sample["mask"], output) == [token_ids(t["tokens"]) for t in turns]
            seen += 1
    return seen


def trains_on_an_engine(tmp_path, monkeypatch, train_fn, *args, expected: int) -> None:
    """`train_fn(run, *args, ...)` (a real-engine suite's dynarl train) with this agent on one
    engine: the trained ids are exactly the engine's, for `expected` samples."""
    probe = tmp_path / "probe"
    probe.mkdir()
    for name, value in probe_env(probe).items():
        monkeypatch.setenv(name, value)
    train_fn(tmp_path / "run", *args, *ARGS, "agentic.queue=fifo", "rollout.num_ranks=1")
    assert trained_exactly_what_the_engine_produced(tmp_path / "run", probe) == expected
