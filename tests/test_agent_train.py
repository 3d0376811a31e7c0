NUM_GPUS = 0
"""`dynarl train` with an agent written against the official openai package
(tests/agent_probe.py: tools, two turns or more, log-probs) on the native engine: three
steps; every turn's ids the trainer got are exactly the tokens the endpoint answered
with, the loss mask covers exactly them, and the ledger digests those samples."""
import json
import os
import subprocess
import sys
import zlib

import numpy as np

from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.workflows.ledger import read_entries

TESTS = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(TESTS, "..", "examples", "agent_openai.yaml")
STEPS, PROMPTS, EPISODES = 3, 2, 4


def agent_run(tmp_path, *args, steps=STEPS):
    probe = tmp_path / "probe"
    probe.mkdir()
    env = dict(os.environ, AGENT_PROBE_DIR=str(probe),
               PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "dynarl.launch.cli", "train", EXAMPLE, f"run.steps={steps}",
         f"run.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={EPISODES}", "trainer.warmup.steps=2",
         "agent.function=agent_probe:play", "run.save_samples=true", "run.checkpoint_every=100", *args,
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp_path / "run", probe, done


def token_ids(texts):
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


def test_an_openai_agent_trains_exactly_the_ids_the_engine_produced(tmp_path):
    run, probe, done = agent_run(tmp_path)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r["episodes"] == PROMPTS * EPISODES and r["turns"] >= 2 * r["episodes"] for r in rows)
    assert all(r["agent_failures"] == 0 and r["agent_http_unauthorized"] == 0 for r in rows), rows
    steps = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    entries = read_entries(str(run / "ledger.jsonl"))
    assert [s["step"] for s in steps] == [e.step for e in entries] == list(range(STEPS))
    seen = 0
    for saved, entry in zip(steps, entries):
        assert [s["id"] for s in saved["samples"]] == list(entry.sample_ids)
        for sample, digest in zip(saved["samples"], entry.digests):
            output = sample["input_ids"][sample["prompt_len"]:]
            assert zlib.crc32(np.asarray(output, dtype=np.int64).tobytes()) == digest
            turns = json.loads((probe / f"{sample['id'].replace('/', '_')}.json").read_text())
            assert len(turns) >= 2
            produced = [token_ids(t["tokens"]) for t in turns]
            assert runs_of_ones(sample["mask"], output) == produced  # the engine's ids, and only they, trained
            assert len(sample["mask"]) == len(output)
            seen += 1
    assert seen == STEPS * PROMPTS * EPISODES
