NUM_GPUS = 0
"""`dynarl train` with an agent written against the official openai package
(tests/agent_probe.py: tools, two turns or more, log-probs) on the native engine: three
steps; every turn's ids the trainer got are exactly the tokens the endpoint answered
with, the loss mask covers exactly them, and the ledger digests those samples."""
import json
import os
import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("on_failure", ["drop", "retry"])
def test_bad_requests_are_refused_and_counted_and_a_raising_agent_is_dropped_while_the_run_goes_on(tmp_path,
                                                                                                   on_failure):
    """tests/agent_unruly.py: wrong token 401, oversized body 413, invalid JSON 400,
    unknown session 404, each counted. Episode 1 always raises: counted, its sample
    trained with no token in the loss. Episode 3 raises in its first attempt: dropped
    likewise, or with agent.on_failure retry played again and trained. Every step ends."""
    done = subprocess.run(
        [sys.executable, "-m", "dynarl.launch.cli", "train", EXAMPLE, "run.steps=2", f"run.prompts_per_step={PROMPTS}",
         f"rollout.samples_per_prompt={EPISODES}", "trainer.warmup.steps=2", "run.checkpoint_every=100",
         "agentic.episodes=agent", "agent.function=agent_unruly:play", "run.save_samples=true",
         f"agent.on_failure={on_failure}", "agentic.tools=[calc,py]",  # (episode 2 runs Python)
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env=dict(os.environ, **probe_env(tmp_path)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    retry = on_failure == "retry"
    for r in rows:
        assert r["episodes"] == PROMPTS * (EPISODES + 2 * retry)  # (played: a retry is an episode too)
        assert r["agent_failures"] == PROMPTS * (2 + retry)  # 1 (twice when retried) and 3's first
        assert r["agent_retries"] == PROMPTS * 2 * retry
        assert (r["agent_http_unauthorized"], r["agent_http_too_large"], r["agent_http_bad_json"],
                r["agent_http_unknown_session"]) == (PROMPTS,) * 4
    for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines():
        for sample in json.loads(line)["samples"]:
            failed = sample["id"].endswith("/1") or (sample["id"].endswith("/3") and not retry)
            assert (sum(sample["mask"]) == 0) == failed, sample["id"]


def test_dynarl_routes_agent_traffic_by_affinity_and_moves_devices(tmp_path, monkeypatch):
    """scheduler.policy=dynarl on the agent's episodes, as on the built-in agentic
    workflow: follow-up requests go back to the engine holding their prefix (its cache
    serves their context), engines serving turns are released mid-step (their turns
    move to the kept ones) and the trainer reshards onto their devices; every episode is
    trained once per step, exactly the ids the engines produced."""
    import yaml
    from conftest import assert_reaped
    from dynarl.components.workflows.ledger import read_entries
    from dynarl.launch.train import prepare
    from test_dynarl_train import FAST
    probe = tmp_path / "probe"
    probe.mkdir()
    monkeypatch.setenv("AGENT_PROBE_DIR", str(probe))
    run = tmp_path / "run"
    args = ("run.steps=2", "run.prompts_per_step=8", f"rollout.samples_per_prompt={EPISODES}", "trainer.warmup.steps=2",
            "runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3",
            "scheduler.policy=dynarl", *FAST, *ARGS)
    job = prepare(EXAMPLE, [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in args)], str(run), None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in (w.g.rollout, w.g.inference, w.g.trainer) for p in group.pids])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r["migrations"].get("workload:rollout") and r["migrations"].get("p2p:trainer") for r in rows), rows
    assert all(r["route_reasons"].get("affinity", 0) > 0 and r["cached_tokens"] > 0 for r in rows), rows
    assert all("reprefill_tokens" in r for r in rows)
    entries = read_entries(str(run / "ledger.jsonl"))
    assert [e.step for e in entries] == [0, 1]
    assert all(len(e.sample_ids) == len(set(e.sample_ids)) == 8 * EPISODES for e in entries)
    assert trained_exactly_what_the_engine_produced(run, probe) == 2 * 8 * EPISODES
