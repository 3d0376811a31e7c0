"""Checkpoints of a run directory: `checkpoints/step_000050/`.

A checkpoint holds the trainer's shards (trainer/native/checkpoint.py), the
ledger copy (`ledger.jsonl`), `state.json` and, written last and atomically,
`manifest.json`: every other file's size and crc32 (manifest.py). `state.json`
holds the RL step the checkpoint was taken *before* (steps 0 .. step-1 are in it);
the data cursor is that step number, because the problem stream is a pure function
of the step (tasks/source.py).

Resuming (`--resume`, and a restart after a lost worker) takes the newest checkpoint
that verifies: every file as the manifest has it, state.json of its own step, a
ledger copy of exactly that many steps. One that does not is named with its file,
what was expected and what was found, and the one before it is tried. A checkpoint
without a manifest (written before checkpoints had one, or cut off between
state.json and manifest.json) is used only when no checkpoint verifies, with a line
saying it is unverified. A directory without state.json is incomplete (the run died
while writing it) and is ignored. Pruning keeps the newest `run.keep_checkpoints`
and never removes the newest verified one.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from typing import Callable, Literal, Sequence

from dynarl.core.files import atomic_open

from dynarl.components.workflows import jsonl, manifest

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


@dataclass(frozen=True, slots=True)
class Found:
    """A checkpoint directory as its listing shows it (nothing read)."""
    path: str
    step: int
    """From the directory's name."""
    status: Literal["sealed", "unsealed", "incomplete"]
    """sealed: it has a manifest; unsealed: state.json without one; incomplete: neither."""


def checkpoint_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{step:06d}")


# --- writing ------------------------------------------------------------------------
def begin(path: str) -> None:
    """Before a checkpoint is written into `path` (again, after a resume): it counts as
    incomplete until `write_state` seals it."""
    manifest.unseal(path)
    try:
        os.remove(os.path.join(path, STATE_FILE))
    except FileNotFoundError:
        pass


def write_state(path: str, state: CheckpointState) -> None:
    """The checkpoint's last files: state.json, then the manifest of everything."""
    with atomic_open(os.path.join(path, STATE_FILE), sync=True) as f:
        json.dump(asdict(state), f)
    manifest.seal(path)


# --- reading ------------------------------------------------------------------------
def scan(run_dir: str) -> list[Found]:
    """Every step_* directory of the run, oldest first."""
    root = os.path.join(run_dir, "checkpoints")
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        path = os.path.join(root, name)
        if not (name.startswith("step_") and name[5:].isdigit() and os.path.isdir(path)):
            continue
        status = ("sealed" if manifest.is_sealed(path) else
                  "unsealed" if os.path.isfile(os.path.join(path, STATE_FILE)) else "incomplete")
        found.append(Found(path, int(name[5:]), status))
    return sorted(found, key=lambda f: f.step)


def read_state(path: str) -> CheckpointState:
    """state.json; ValueError naming the file when it cannot be read as one."""
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            return CheckpointState(**json.load(f))
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{STATE_FILE}: unreadable ({type(exc).__name__}: {exc})") from None


def content_problem(path: str, step: int) -> str | None:
    """What is wrong inside a checkpoint of RL step `step` that a manifest cannot
    say (an unsealed one has none): state.json of another step or unreadable, a
    ledger copy without exactly `step` steps. None: nothing."""
    try:
        state = read_state(path)
    except ValueError as exc:
        return str(exc)
    if state.step != step:
        return f"{STATE_FILE}: expected step {step}, found step {state.step}"
    ledger = os.path.join(path, LEDGER_FILE)
    if os.path.exists(ledger):
        try:
            steps = [record["step"] for record in jsonl.read(ledger)]
        except (ValueError, KeyError, TypeError) as exc:
            return f"{LEDGER_FILE}: unreadable ({exc})"
        if steps != list(range(step)):
            return f"{LEDGER_FILE}: expected {_steps(list(range(step)))}, found {_steps(steps)}"
    return None


def _steps(steps: list[int]) -> str:
    if not steps:
        return "none"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}..{steps[-1]}"
    return f"{len(steps)} steps ending {steps[-3:]}"


def problem(found: Found) -> str | None:
    """Why checkpoint `found` must not be resumed from, or None. Reads every file of a
    sealed one (manifest.verify)."""
    if found.status == "incomplete":
        return f"no {STATE_FILE} (incomplete)"
    if found.status == "sealed":
        wrong = manifest.verify(found.path)
        if wrong is not None:
            return wrong
    return content_problem(found.path, found.step)


# --- decisions ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ResumeChoice:
    chosen: Found | None
    rejected: list[tuple[Found, str]]
    """Newer checkpoints passed over, newest first, each with why."""

    @property
    def unverified(self) -> bool:
        return self.chosen is not None and self.chosen.status == "unsealed"


UNSEALED = (f"no {manifest.MANIFEST_FILE} (cut off between {STATE_FILE} and it, or written before "
            "checkpoints had one): unverified")


def choose_resume(found: Sequence[Found], problem: Callable[[Found], str | None]) -> ResumeChoice:
    """The newest sealed checkpoint without a problem; where none is, the newest
    unsealed one without a problem (unverified). `problem` is asked newest first and
    only as far as needed (it reads every file of a sealed checkpoint)."""
    rejected: list[tuple[Found, str]] = []
    for status in ("sealed", "unsealed"):
        for f in sorted((f for f in found if f.status == status), key=lambda f: -f.step):
            why = problem(f)
            if why is None:
                if status == "sealed":  # (newer unsealed ones were not asked)
                    rejected += [(u, UNSEALED) for u in found if u.status == "unsealed" and u.step > f.step]
                newer = [(r, w) for r, w in rejected if r.step > f.step]
                return ResumeChoice(f, sorted(newer, key=lambda r: -r[0].step))
            rejected.append((f, why))
    return ResumeChoice(None, sorted(rejected, key=lambda r: -r[0].step))


def to_prune(found: Sequence[Found], keep: int, verified: str | None) -> list[str]:
    """The checkpoints pruning removes: complete ones (sealed or unsealed) but the newest
    `keep` and `verified` (the newest verified one, kept whatever is newer), and
    incomplete ones older than the newest complete one."""
    complete = [f for f in found if f.status != "incomplete"]
    kept = {f.path for f in complete[-keep:]} | {verified}
    newest = complete[-1].step if complete else -1
    return [f.path for f in found if f.path not in kept and (f.status != "incomplete" or f.step < newest)]


# --- the run directory --------------------------------------------------------------
def resume_point(run_dir: str) -> ResumeChoice:
    return choose_resume(scan(run_dir), problem)


def choice_notes(choice: ResumeChoice) -> list[str]:
    """One line per checkpoint passed over, and one for an unverified choice."""
    chosen = choice.chosen
    then = "" if chosen is None or choice.unverified else (
        f"; resuming from {os.path.basename(chosen.path)}, the newest that verifies")
    notes = [f"checkpoint {f.path} not used: {why}{then}" for f, why in choice.rejected]
    if choice.unverified:
        notes.append(f"checkpoint {chosen.path} has no {manifest.MANIFEST_FILE} and none verifies (written before "
                     "checkpoints had one, or cut off before it): resuming from it unverified")
    return notes


def resume_checkpoint(run_dir: str, note: Callable[[str], None]) -> tuple[str, CheckpointState] | None:
    """The checkpoint a resume of `run_dir` starts from (resume_point) with its state,
    each line of choice_notes told to `note`; None when the run has no complete
    checkpoint. ValueError when it has some and none can be used (the message names
    each and why)."""
    choice = resume_point(run_dir)
    if choice.chosen is None:
        if choice.rejected:
            raise ValueError("no checkpoint can be used: " + "; ".join(choice_notes(choice)))
        return None
    for line in choice_notes(choice):
        note(line)
    return choice.chosen.path, read_state(choice.chosen.path)


def latest_checkpoint(run_dir: str) -> tuple[str, CheckpointState] | None:
    """The checkpoint a resume of `run_dir` starts from, or None."""
    chosen = resume_point(run_dir).chosen
    return None if chosen is None else (chosen.path, read_state(chosen.path))


def prune(run_dir: str, keep: int, verified: str | None = None) -> None:
    """Removes what `to_prune` says; `verified`: the checkpoint just sealed."""
    for path in to_prune(scan(run_dir), keep, verified):
        shutil.rmtree(path, ignore_errors=True)


def resume_mismatch(state: CheckpointState, seed: int, prompts_per_step: int) -> str | None:
    """Why a run with these settings cannot continue from `state`, or None: the data
    order of the steps after it depends on both."""
    if (state.seed, state.prompts_per_step) == (seed, prompts_per_step):
        return None
    return (f"the checkpoint of step {state.step} was written with run.seed={state.seed}, "
            f"run.prompts_per_step={state.prompts_per_step}: resume with the same values")


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
