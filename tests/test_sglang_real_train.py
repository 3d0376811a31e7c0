NUM_GPUS = 0
"""`dynarl train rollout.backend=sglang` end to end on a real SGLang 0.5.23 engine on the
CPU (SGLang's CPU engine; tests/sglang_cpu_site stands in for the CUDA kernel package
PyPI lacks, see tests/sglang_real.py): the built-in model and task, a few steps of the
GRPO and the agentic workflow, static and with scheduler.policy=dynarl moving engines
mid-step. Every step's weights reach the engines (begin/update/end weight update, no
restart), every sample is trained once, and no process of the run (workers, SGLang's
scheduler and detokenizer processes) outlives it. Run by .ci/engine_sglang; the main
run deselects it."""
import pytest

from agent_probe import trains_on_an_engine
from engine_train import (MOVING, agentic_args, moves_and_trains_the_static_runs_samples,
                          refuses_a_model_it_cannot_serve, train)

pytestmark = pytest.mark.real_engine

STEPS, PROMPTS, SAMPLES = 3, 4, 4
CPU = ["rollout.sglang.mem_fraction_static=0.3",
       "rollout.sglang.server_args={max_total_tokens: 4096, skip_server_warmup: true}"]
"""A small KV cache on the CPU (SGLang would size it from the host's memory)."""


@pytest.fixture(autouse=True, scope="module")
def cpu_env():
    import sglang_real
    sglang_real.ready_cpu_env()  # the workers inherit it


def _train(run, *args, steps=STEPS):
    return train(run, "rollout.backend=sglang", *CPU, *args, steps=steps)


def test_dynarl_train_runs_on_sglang(tmp_path):
    _, entries = _train(tmp_path / "run", f"run.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}",
                        "rollout.max_new_tokens=32", "rollout.num_ranks=1")
    for e in entries:
        assert len(e.sample_ids) == PROMPTS * SAMPLES == len(set(e.sample_ids))


def test_an_openai_agent_trains_on_sglang_the_ids_sglang_produced(tmp_path, monkeypatch):
    """An agent on the official openai package (tests/agent_probe.py: tools, two turns)
    through the job's endpoint in front of SGLang: three steps; the loss mask's runs are
    exactly the tokens SGLang answered each turn with."""
    trains_on_an_engine(tmp_path, monkeypatch, _train, *agentic_args(PROMPTS, SAMPLES),
                        expected=STEPS * PROMPTS * SAMPLES)


def test_dynarl_moves_sglang_engines_and_trains_the_static_runs_samples(tmp_path):
    """scheduler.policy=dynarl releases SGLang engines mid-step: their requests, tokens so
    far, move to the kept engines (export_inflight / import_inflight on real SGLang) while
    the trainer takes their devices; each step trains the static run's samples, once."""
    moves_and_trains_the_static_runs_samples(tmp_path, _train, *MOVING)


def test_the_agentic_workflow_on_sglang_with_its_priority_queue_and_dynarl(tmp_path):
    """Multi-turn tool episodes through SGLang (each turn a request; tool-count priority
    reaching SGLang's priority scheduling), static, then with scheduler.policy=dynarl
    moving engines mid-step: each step trains the static run's episodes, once."""
    rows = moves_and_trains_the_static_runs_samples(tmp_path, _train, *agentic_args(PROMPTS, SAMPLES),
                                                    "rollout.sglang.enable_priority_scheduling=true")
    for r in rows:
        assert r["episodes"] == PROMPTS * SAMPLES and r["episodes"] <= r["turns"] <= 3 * r["episodes"]


def test_a_model_sglang_cannot_serve_is_one_line_and_rc_2(tmp_path):
    refuses_a_model_it_cannot_serve(tmp_path, "sglang")
