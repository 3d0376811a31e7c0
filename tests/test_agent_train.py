NUM_GPUS = 0
"""`dynarl train` with an agent written against the official openai package
(tests/agent_probe.py: tools, two turns or more, log-probs) on the native engine: three
steps; every turn's ids the trainer got are exactly the tokens the endpoint answered
with, the loss mask covers exactly them, and the ledger digests those samples."""
import json
import os
import subprocess
import sys

from agent_probe import ARGS, probe_env, trained_exactly_what_the_engine_produced

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "agent_openai.yaml")
STEPS, PROMPTS, EPISODES = 3, 2, 4


def test_an_openai_agent_trains_exactly_the_ids_the_engine_produced(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "dynarl.launch.cli", "train", EXAMPLE, f"run.steps={STEPS}",
         f"run.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={EPISODES}", "trainer.warmup.steps=2",
         "run.checkpoint_every=100", *ARGS, "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, env=dict(os.environ, **probe_env(probe)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r["episodes"] == PROMPTS * EPISODES and r["turns"] >= 2 * r["episodes"] for r in rows)
    assert all(r["agent_failures"] == 0 and r["agent_http_unauthorized"] == 0 for r in rows), rows
    assert trained_exactly_what_the_engine_produced(tmp_path / "run", probe) == STEPS * PROMPTS * EPISODES
