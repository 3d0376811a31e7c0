"""Checkpoints of a run directory: `checkpoints/step_000050/`.

A checkpoint holds the trainer's shards (trainer/native/checkpoint.py), the
ledger copy (`ledger.jsonl`) and `state.json`, written last and atomically: a
directory without state.json is incomplete (the run died while writing it) and
is ignored. `state.json` holds the RL step the checkpoint was taken *before*
(steps 0 .. step-1 are in it); the data cursor is that step number, because the
problem stream is a pure function of the step (tasks/source.py).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass

from dynarl.core.files import atomic_open

STATE_FILE = "state.json"
LEDGER_FILE = "ledger.jsonl"
CRITIC_DIR = "critic"
"""workflow ppo: the critic's state inside a checkpoint (components/workflows/ppo.py)."""
LEARNER_FILE = "learner.safetensors"
"""workflow embodied: the learner's state, the whole checkpoint (components/embodied/workers.py)."""


@dataclass(frozen=True, slots=True)
class CheckpointState:
    step: int
    """RL steps trained into this checkpoint (the next step to run)."""
    trainer_step: int
    """Optimizer steps, warm start included."""
    seed: int
    prompts_per_step: int


def checkpoint_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{step:06d}")


def write_state(path: str, state: CheckpointState) -> None:
    with atomic_open(os.path.join(path, STATE_FILE), sync=True) as f:
        json.dump(asdict(state), f)


def complete_checkpoints(run_dir: str) -> list[tuple[str, CheckpointState]]:
    """Complete checkpoints, oldest first."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    found = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        state_file = os.path.join(path, STATE_FILE)
        if name.startswith("step_") and os.path.isfile(state_file):
            with open(state_file) as f:
                found.append((path, CheckpointState(**json.load(f))))
    return sorted(found, key=lambda item: item[1].step)


def resume_mismatch(state: CheckpointState, seed: int, prompts_per_step: int) -> str | None:
    """Why a run with these settings cannot continue from `state`, or None: the data
    order of the steps after it depends on both."""
    if (state.seed, state.prompts_per_step) == (seed, prompts_per_step):
        return None
    return (f"the checkpoint of step {state.step} was written with run.seed={state.seed}, "
            f"run.prompts_per_step={state.prompts_per_step}: resume with the same values")


def latest_checkpoint(run_dir: str) -> tuple[str, CheckpointState] | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def prune(run_dir: str, keep: int) -> None:
    """Deletes all but the newest `keep` complete checkpoints, and incomplete ones older than them."""
    found = complete_checkpoints(run_dir)
    kept = {path for path, _ in found[-keep:]}
    newest = found[-1][1].step if found else -1
    root = os.path.join(run_dir, "checkpoints")
    for name in os.listdir(root) if os.path.isdir(root) else ():
        path = os.path.join(root, name)
        if path in kept:
            continue
        complete = os.path.isfile(os.path.join(path, STATE_FILE))
        step = int(name.removeprefix("step_")) if name.startswith("step_") and name[5:].isdigit() else -1
        if complete or step < newest:
            shutil.rmtree(path, ignore_errors=True)


def workflow_refused(path: str, workflow: str) -> str | None:
    """Why checkpoint `path` cannot resume a run of `workflow`, or None: an embodied
    run's checkpoint is its learner's alone, a ppo run's has its critic's state too."""
    embodied = os.path.isfile(os.path.join(path, LEARNER_FILE))
    if (workflow == "embodied") != embodied:
        made = "the embodied workflow" if embodied else "an LLM workflow (grpo, agentic, ppo)"
        return f"it was written by {made}: resume it with that workflow, not {workflow}"
    if workflow == "ppo" and not os.path.isdir(os.path.join(path, CRITIC_DIR)):
        return (f"no critic state ({CRITIC_DIR}/): the checkpoint is from a run without a critic "
                "(workflow grpo); resume it with that workflow")
    return None
