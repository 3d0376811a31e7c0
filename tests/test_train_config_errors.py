NUM_GPUS = 0
"""Bad configs fail before any worker starts, with one line naming the field."""

import json
import os
import subprocess
import sys

import pytest

from dynarl import ConfigError
from dynarl.components.workflows.config import load_config
from dynarl.launch.train import UsageError, prepare


@pytest.mark.parametrize("override,path,fragment", [
    pytest.param(("rollout.temprature", 1.0), "rollout.temprature", "unknown key", id="unknown-key"),
    pytest.param(("run.steps", "many"), "run.steps", "expected an integer", id="wrong-type"),
    pytest.param(("placement.mode", "diagonal"), "placement.mode", "choose from 'colocated', 'spatial', 'hybrid'",
                 id="bad-choice"),
    pytest.param(("placement.mode", "temporal"), "placement.mode", "now called 'colocated'", id="renamed-value"),
    pytest.param(("trainer.num_ranks", 3), "trainer.num_ranks", "3 ranks need 3 devices but the cluster has 2",
                 id="more-ranks-than-devices"),
    pytest.param(("placement.mode", "spatial"), "placement.mode", "= 5 devices but the cluster has 2",
                 id="placement-does-not-fit"),
    pytest.param(("trainer.engine.lr", -1), "trainer.engine.lr", "must be >= 0", id="range"),
    pytest.param(("rollout.top_p", 5), "rollout.top_p", "must be in (0, 1]", id="sampling"),
    pytest.param(("placement.pools", [["rollout"], ["trainer"]]), "placement.pools", "only used by mode 'hybrid'",
                 id="pools-without-hybrid"),
    pytest.param(("algorithm.name", "ppo2"), "algorithm.name", "choose from 'grpo', 'dr_grpo', 'gspo', 'dapo'",
                 id="unknown-objective"),
])
def test_config_errors_name_the_field(override, path, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.path == path
    assert fragment in str(info.value)


AGENTIC = [("workflow", "agentic"), ("task.kind", "calc")]


@pytest.mark.parametrize("overrides,path", [
    pytest.param([("rollout.backend", "sglang")], "rollout.sglang.enable_priority_scheduling", id="sglang"),
    pytest.param([("rollout.backend", "vllm")], "rollout.vllm.scheduling_policy", id="vllm"),
])
def test_the_agentic_priority_queue_needs_the_engines_priority_mode(overrides, path):
    with pytest.raises(ConfigError, match="FCFS") as info:
        load_config(None, AGENTIC + overrides)
    assert info.value.path == path
    load_config(None, AGENTIC + overrides + [("agentic.queue", "fifo")])  # FCFS asked for: fine
    mode = {"sglang": ("rollout.sglang.enable_priority_scheduling", True),
            "vllm": ("rollout.vllm.scheduling_policy", "priority")}[overrides[0][1]]
    load_config(None, AGENTIC + overrides + [mode])


def test_missing_dataset_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        prepare(None, [("task.kind", "dataset"), ("task.dataset.path", str(tmp_path / "nope.jsonl"))],
                str(tmp_path / "run"), None)
    assert info.value.path == "task.dataset.path" and "does not exist" in str(info.value)
    assert not os.path.exists(tmp_path / "run")


def test_dataset_with_no_usable_row(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"question": "1+1="}\n')
    with pytest.raises(ConfigError, match="no usable row.*row 1: missing field 'prompt'"):
        prepare(None, [("task.kind", "dataset"), ("task.dataset.path", str(tmp_path / "d.jsonl"))], None, None)


def test_resume_needs_a_checkpoint(tmp_path):
    (tmp_path / "config.yaml").write_text("run: {steps: 3}\n")
    with pytest.raises(UsageError, match="no complete checkpoint"):
        prepare(None, [], None, str(tmp_path))


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_cli_unknown_key_exits_2_without_traceback(tmp_path):
    result = cli("rollout.temprature=0.5", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2
    assert "rollout.temprature: unknown key" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "run")  # nothing started, nothing written


def test_cli_unknown_objective_exits_2_naming_algorithm_name(tmp_path):
    result = cli("algorithm.name=ppo2", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "algorithm.name: 'ppo2' is not allowed" in result.stderr
    assert not os.path.exists(tmp_path / "run")


def test_cli_errors_from_a_yaml_file_and_a_range(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("placement:\n  mode: spatial\nrollout:\n  num_ranks: two\n")
    result = cli(str(config), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "rollout.num_ranks: expected an integer, got 'two'" in result.stderr
    result = cli("run.steps=0", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "run.steps: must be >= 1, got 0" in result.stderr


def test_resume_with_other_data_settings_fails_before_anything_is_rewritten(tmp_path):
    from dynarl.components.workflows import checkpoints as ckpt
    (tmp_path / "config.yaml").write_text("run: {steps: 3, prompts_per_step: 4}\n")
    os.makedirs(ckpt.checkpoint_dir(str(tmp_path), 2))
    ckpt.write_state(ckpt.checkpoint_dir(str(tmp_path), 2),
                     ckpt.CheckpointState(step=2, trainer_step=2, seed=0, prompts_per_step=4))
    with pytest.raises(UsageError, match="step 2 was written with run.seed=0, run.prompts_per_step=4"):
        prepare(None, [("run.prompts_per_step", 8)], None, str(tmp_path))
    assert (tmp_path / "config.yaml").read_text() == "run: {steps: 3, prompts_per_step: 4}\n"
    assert prepare(None, [("run.steps", 5)], None, str(tmp_path)).checkpoint[1].step == 2  # same data: fine


def test_an_interrupted_run_says_how_to_continue_only_when_it_can(tmp_path):
    from dynarl.components.workflows import checkpoints as ckpt
    job = prepare(None, [], str(tmp_path / "run"), None)
    os.makedirs(job.run_dir, exist_ok=True)  # (prepare made it: the job owns it)
    assert "nothing to resume" in job._how_to_continue() and "--resume" not in job._how_to_continue()
    os.makedirs(ckpt.checkpoint_dir(job.run_dir, 0))
    ckpt.write_state(ckpt.checkpoint_dir(job.run_dir, 0), ckpt.CheckpointState(0, 0, 0, job.cfg.run.prompts_per_step))
    assert job._how_to_continue() == f"continue from step 0 with: dynarl train --resume {job.run_dir}"


def test_resuming_a_run_that_has_all_its_steps_says_so_before_starting(tmp_path):
    from dynarl.components.workflows import checkpoints as ckpt
    (tmp_path / "config.yaml").write_text("run: {steps: 3}\n")
    os.makedirs(ckpt.checkpoint_dir(str(tmp_path), 3))
    per_step = load_config(None, []).run.prompts_per_step
    ckpt.write_state(ckpt.checkpoint_dir(str(tmp_path), 3), ckpt.CheckpointState(3, 3, 0, per_step))
    with pytest.raises(UsageError, match="trained 3 steps and run.steps is 3, so there is nothing to run"):
        prepare(None, [], None, str(tmp_path))
    assert prepare(None, [("run.steps", 4)], None, str(tmp_path)).checkpoint[1].step == 3


def test_a_model_folder_of_an_unsupported_architecture_fails_at_load_in_one_line(tmp_path):
    """An unsupported folder (a Llama one did, before Llama was supported) used to pass
    --dry-run and fail at worker start with missing tensors; now the config load
    refuses it, listing what is supported."""
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 128, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}))
    for extra in ([], ["--dry-run"]):
        result = cli(f"model.path={folder}", *extra, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "model_type 'gpt2' is not supported; supported: qwen2, qwen3, llama" in lines[0], lines
        assert not os.path.exists(tmp_path / "run")


def test_a_run_written_before_the_rename_resumes_colocated(tmp_path):
    """--resume reads the run's own config.yaml, written fully resolved: one from before
    the rename says 'temporal' (the old default), and is read as colocated."""
    from dynarl.launch.train_prepare import resolve_config
    (tmp_path / "config.yaml").write_text("placement:\n  mode: temporal\n")
    assert resolve_config(None, [], str(tmp_path)).placement.mode == "colocated"


AGENT = [("workflow", "agentic"), ("task.kind", "calc"), ("agentic.episodes", "agent")]


@pytest.mark.parametrize("overrides,path,fragment", [
    pytest.param([("agent.function", "nosuch.mod:play")], "agent.function", "cannot import 'nosuch.mod'",
                 id="does-not-import"),
    pytest.param([("agent.function", "json:nothere")], "agent.function", "'json' has no 'nothere'", id="no-such-fn"),
    pytest.param([("agent.function", "json:dumps")], "agent.function", "must be an async def", id="not-async"),
    pytest.param([("agent.function", "play")], "agent.function", "must be 'module:function'", id="no-module"),
    pytest.param([("agent.episodes_per_prompt", 3)], "agent.episodes_per_prompt", "is the group size",
                 id="two-group-sizes"),
    pytest.param([("rollout.oversample", 2)], "rollout.oversample", "cannot wait in a checkpoint", id="partial"),
    pytest.param([("agent.on_failure", "ignore")], "agent.on_failure", "'drop', 'retry'", id="on-failure"),
    pytest.param([("run.save_samples", True), ("trainer.streaming", True)], "run.save_samples",
                 "never meet in one place", id="save-samples-streaming"),
])
def test_an_agent_config_error_names_its_field(overrides, path, fragment):
    with pytest.raises(ConfigError, match=fragment) as info:
        load_config(None, AGENT + overrides)
    assert info.value.path == path
    load_config(None, AGENT)  # the built-in agent: fine
