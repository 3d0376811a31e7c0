NUM_GPUS = 0
"""Partial rollout (rollout.oversample > 1, components/workflows/partial.py): more
groups generate than a step trains; the first N to finish train, the others continue
in later steps from their tokens so far, each run of tokens recording the weights that
made it; a group whose oldest token would be trained over algorithm.max_staleness is
generated again (counted); every sample is trained once, also across a kill -9."""

import asyncio
import json
import os
import subprocess
import sys

import pytest

from dynarl import ConfigError
from dynarl.components.experience import END, PromptGroup, Sample
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.components.rollout.generation import Generation
from dynarl.components.workflows.config import load_config
from dynarl.components.workflows.ledger import read_entries
from dynarl.components.workflows.partial import PromptStream, due, extra_groups, oldest_version, plan, takes
from dynarl.core.virtual_time import run_virtual
from dynarl.launch.train import prepare
from conftest import assert_reaped, kill_9_mid_run
from grpo_tiny import TINY, overrides

PARTIAL = ("rollout.oversample=1.5", "algorithm.max_staleness=1")
N_PROMPTS, N_SAMPLES = 8, 4


# --- the samples' record of who made their tokens -------------------------------------
def test_a_carried_sample_records_each_run_of_tokens_and_is_as_old_as_its_oldest():
    s = Sample("a", 1)
    s.carry([5, 6, 7], [-0.1, -0.2, -0.3], version=3)
    assert s.partial and s.segments == [[0, 3, 3]] and s.finish == ""
    s.carry([5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4], version=4)
    s.finished([5, 6, 7, 8, 9], [-0.1] * 5, "stop", version=5)
    assert s.segments == [[0, 3, 3], [3, 4, 4], [4, 5, 5]] and s.version == 3 and not s.partial
    whole = Sample("b", 2)
    whole.finished([1, 2], [-0.5, -0.5], "length", version=7)
    assert whole.segments is None and whole.version == 7
    s.restart()
    assert (s.output_ids, s.segments, s.version, s.finish) == ((), None, -1, "")


def test_a_group_round_trips_its_segments_and_reads_a_sample_written_before_them():
    s = Sample("a", 1)
    s.carry([5, 6], [-0.1, -0.2], version=2)
    g = PromptGroup(0, "p", "x", [1, 2], [s, Sample("b", 2)])
    back = PromptGroup.from_json(json.loads(json.dumps(g.to_json())))
    assert back.samples[0].segments == [[0, 2, 2]] and back.samples[0].partial and not back.samples[1].partial
    old = g.to_json()
    old[4] = [fields[:-3] for fields in old[4]]  # no `segments`, `episode` nor `teacher_logprobs`: format 1
    assert PromptGroup.from_json(old).samples[0].segments is None
    older = g.to_json()
    older[4] = [fields[:-2] for fields in older[4]]  # no `episode` field: written before agentic partial rollout
    back = PromptGroup.from_json(older).samples[0]
    assert back.segments == [[0, 2, 2]] and back.episode is None


# --- the step's plan (a pure function) ---------------------------------------------------
def group(name: str, *samples: tuple) -> PromptGroup:
    """samples: ("new",) | ("partial", tokens, version) | ("done", tokens, version)."""
    out = []
    for k, (kind, *rest) in enumerate(samples):
        s = Sample(f"{name}/{k}", k)
        if kind == "partial":
            s.carry(list(range(rest[0])), [-1.0] * rest[0], rest[1])
        elif kind == "done":
            s.finished(list(range(rest[0])), [-1.0] * rest[0], "stop", rest[1])
        out.append(s)
    return PromptGroup(99, name, "", [1], out)


@pytest.mark.parametrize("carry, step, k, ready, inflight, kept, regenerated", [
    # nothing carried: the fresh groups generate
    ([], 0, 1, [], ["f0", "f1"], [], (0, 0)),
    # an unfinished group within the bound continues, before the fresh ones
    ([group("u", ("partial", 5, 3), ("new",))], 4, 1, [], ["u", "f0", "f1"], [], (0, 0)),
    # a whole group (finished after the last batch closed) trains first
    ([group("w", ("done", 4, 3), ("done", 2, 3))], 4, 1, ["w"], ["f0", "f1"], [], (0, 0)),
    # a sample over the bound: generated again from its prompt, its tokens counted as dropped
    # (its group's sample within the bound stays)
    ([group("u", ("partial", 5, 2), ("done", 3, 3))], 4, 1, [], ["u", "f0", "f1"], [], (1, 5)),
    # a finished sample over the bound too: it generates again, its group is unfinished again
    ([group("w", ("done", 4, 2), ("done", 2, 3))], 4, 1, [], ["w", "f0", "f1"], [], (1, 4)),
    # a wider bound keeps it
    ([group("w", ("done", 4, 2), ("done", 2, 3))], 4, 2, ["w"], ["f0", "f1"], [], (0, 0)),
    # more whole groups than a batch: the oldest train, the rest wait (a step generates one group at least)
    ([group("w1", ("done", 1, 3), ("done", 1, 3)), group("w0", ("done", 1, 2), ("done", 1, 3)),
      group("w2", ("done", 1, 3), ("done", 1, 3))], 3, 1, ["w0"], ["f0", "f1"], ["w1", "w2"], (0, 0)),
])
def test_plan(carry, step, k, ready, inflight, kept, regenerated):
    fresh = [group("f0", ("new",)), group("f1", ("new",))]
    p = plan(carry, fresh, step, num_groups=2, max_staleness=k)
    assert [g.problem for g in p.ready] == ready
    assert [g.problem for g in p.inflight] == inflight
    assert [g.problem for g in p.kept] == kept
    assert (p.regenerated_groups, p.regenerated_tokens) == regenerated
    assert [g.index for g in p.ready + p.inflight] == list(range(len(ready) + len(inflight)))
    for g in p.ready + p.inflight:  # nothing the step trains is staler than the bound
        assert oldest_version(g) is None or step - oldest_version(g) <= k


@pytest.mark.parametrize("groups, step, k, keys", [
    ([], 4, 1, set()),
    # fresh (no token yet) and made this step: never due
    ([group("f", ("new",)), group("n", ("partial", 3, 4))], 4, 1, set()),
    # made by the step before: at k 1 the next step would train it 2 behind: due now
    ([group("u", ("partial", 5, 3), ("new",))], 4, 1, {"u/0"}),
    # a deeper bound lets it wait one more step
    ([group("u", ("partial", 5, 3), ("new",))], 4, 2, set()),
    ([group("u", ("partial", 5, 2), ("new",))], 4, 2, {"u/0"}),
    # the group's oldest token counts (one sample newer, one older)
    ([group("m", ("partial", 5, 4), ("done", 2, 3))], 4, 1, {"m/0"}),
])
def test_a_group_is_due_when_the_next_step_would_train_it_past_the_bound(groups, step, k, keys):
    assert due(groups, step, k) == keys


@pytest.mark.parametrize("is_due, taken, due_left, need, taken_", [
    (False, 0, 0, 2, True),
    (False, 1, 0, 2, True),
    (False, 2, 0, 2, False),   # the batch is full
    (False, 1, 1, 2, False),   # the last place is kept for a due group still to come
    (False, 0, 1, 2, True),
    (True, 1, 0, 2, True),     # a due group takes its kept place
    (True, 1, 3, 2, True),
    (True, 2, 1, 2, False),    # more due groups than places: carried (the next plan starts it again)
])
def test_the_batch_keeps_a_place_for_each_due_group(is_due, taken, due_left, need, taken_):
    assert takes(is_due, taken, due_left, need) is taken_


def test_the_prompt_stream_takes_steps_in_order_across_their_ends():
    class Steps:
        def groups(self, step):
            return [PromptGroup(i, f"{step}.{i}", "", [1], []) for i in range(3)]
    stream = PromptStream(Steps())
    assert [g.problem for g in stream.take(2)] == ["0.0", "0.1"]
    assert [g.problem for g in stream.take(5)] == ["0.2", "1.0", "1.1", "1.2", "2.0"]
    assert (stream.step, stream.offset) == (2, 1)
    assert stream.take(0) == []


@pytest.mark.parametrize("oversample, n, extra", [(1.0, 8, 0), (1.5, 8, 4), (1.1, 8, 0), (1.125, 8, 1), (2, 3, 3)])
def test_extra_groups(oversample, n, extra):
    assert extra_groups(oversample, n) == extra


# --- a generation continues a carried sample ------------------------------------------
class Inbox:
    def __init__(self, items):
        self.items = list(items)

    async def get(self):
        return self.items.pop(0)


class Outbox:
    def __init__(self):
        self.chunks = []

    async def put(self, chunk, weight=1, made_of=None):
        self.chunks.append(chunk)

    async def flush(self):
        pass


def test_a_closed_generation_hands_back_its_unfinished_groups_and_the_next_continues_them():
    lengths = [[20, 400], [30, 40]]  # group 0 has a long sample, group 1 is short

    def groups():
        out = []
        for i, row in enumerate(lengths):
            samples = [Sample(f"g{i}/{k}", k, max_new_tokens=n) for k, n in enumerate(row)]
            out.append(PromptGroup(i, f"p{i}", "", [3, 4, 5], samples))
        return out

    async def two_steps():
        engine = EmulatedRolloutEngine(EmulatedRolloutConfig())
        await engine.update_weights(None, 0)
        box = Outbox()
        first = Generation(engine, box, 1, {"max_new_tokens": 1000})
        gs = groups()
        fetch = asyncio.ensure_future(first.fetch(Inbox([*gs, END])))
        drive = asyncio.ensure_future(first.drive(fetch))
        while not box.chunks:  # group 1 is done; group 0's long sample is still going
            await asyncio.sleep(0.01)
        items = await first.close()
        await drive
        assert [g.problem for chunk in box.chunks for g in chunk] == ["p1"]
        assert [it.group.problem for it in items] == ["p0"]
        carried = items[0].group
        (request,) = items[0].inflight
        so_far = list(request.output_token_ids)
        assert 0 < len(so_far) < 400 and carried.samples[0].finish  # the short sample stays finished
        carried.samples[1].carry(so_far, request.output_logprobs, 0)
        made_first = first.num_tokens
        await engine.resume()

        await engine.update_weights(None, 1)
        box2 = Outbox()
        second = Generation(engine, box2, 1, {"max_new_tokens": 1000})
        fetch = asyncio.ensure_future(second.fetch(Inbox([carried, END])))
        await second.drive(fetch)
        return so_far, made_first, second.num_tokens, box2.chunks

    so_far, made_first, made_second, chunks = run_virtual(two_steps())
    (done,) = [g for chunk in chunks for g in chunk]
    long = done.samples[1]
    assert len(long.output_ids) == 400 and list(long.output_ids[:len(so_far)]) == so_far
    assert long.segments == [[0, len(so_far), 0], [len(so_far), 400, 1]] and long.version == 0
    assert made_first == 20 + 30 + 40 + len(so_far) and made_second == 400 - len(so_far)  # each step's own


# --- config ------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, field, fragment", [
    (("rollout.oversample=0.5",), "rollout.oversample", "in [1, 4]"),
    (("rollout.oversample=1.1", "algorithm.max_staleness=1"), "rollout.oversample", "adds no prompt group"),
    (("rollout.oversample=1.5",), "algorithm.max_staleness", "set it >= 1"),
    (PARTIAL + ("rollout.temperature=0.7",), "rollout.oversample", "set rollout.temperature 1"),
    (PARTIAL + ("rollout.backend=sglang",), "rollout.oversample", "needs native or emulated engines"),
])
def test_bad_partial_settings_name_the_field(extra, field, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides(*extra))
    assert info.value.path == field
    assert fragment in str(info.value)


def test_a_deeper_bound_is_taken_with_partial_rollout():
    cfg = load_config(None, overrides("rollout.oversample=1.5", "algorithm.max_staleness=3"))
    assert cfg.algorithm.max_staleness == 3 and cfg.rollout.oversample == 1.5


# --- dynarl train --------------------------------------------------------------------------
def stream_ids(steps: int) -> list[str]:
    """The sample ids of the prompt stream's first `steps` steps, in order."""
    cfg = load_config(None, overrides(*PARTIAL))
    from dynarl.components.tasks.source import ProblemSource
    source = ProblemSource(cfg.task, cfg.run.seed)
    return [f"{p.id}/{k}" for p in source.problems(0, steps * N_PROMPTS) for k in range(N_SAMPLES)]


def check_ledger(run_dir: str, steps: int, k: int, samples: int = N_SAMPLES) -> None:
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == list(range(steps))
    ids = [i for e in entries for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == steps * N_PROMPTS * samples  # every sample once, each step whole
    if samples == N_SAMPLES:
        assert set(ids) <= set(stream_ids(2 * steps))  # from the prompt stream, none invented
    for e in entries:
        assert all(0 <= e.step - v <= k for v in e.versions), e.step


def test_a_partial_run_trains_every_sample_once_within_the_bound(tmp_path):
    run_dir = str(tmp_path / "run")
    job = prepare(None, overrides(*PARTIAL, "run.steps=4"), run_dir, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in (w.g.rollout, w.g.inference, w.g.trainer) for p in group.pids])
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert all(r["carried_groups"] >= 1 for r in rows)  # 12 groups generate, 8 train: some carried each step
    assert rows[0]["staleness_max"] == 0 and max(r["staleness_max"] for r in rows) == 1
    assert all(r["samples"] == N_PROMPTS * N_SAMPLES for r in rows)
    check_ledger(run_dir, 4, k=1)


def test_kill_9_mid_step_then_resume_trains_the_carried_groups_once(tmp_path):
    steps, every = 6, 3
    run = str(tmp_path / "run")
    argv = [sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, *PARTIAL, f"run.steps={steps}",
            f"run.checkpoint_every={every}", "run.keep_checkpoints=5", "--run-dir", run]
    killed_after = kill_9_mid_run(argv, run, every + 1, tmp_path)
    assert every + 1 <= killed_after < steps
    checkpoint = os.path.join(run, "checkpoints", f"step_{every:06d}")
    kept = json.load(open(os.path.join(checkpoint, "partial.json")))
    assert kept["carry"]  # the checkpoint holds groups started and not yet trained

    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "--resume", run],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"resumed from {checkpoint}" in result.stdout
    check_ledger(run, steps, k=1)
    entries = read_entries(os.path.join(run, "ledger.jsonl"))
    trained_after = {i for e in entries if e.step >= every for i in e.sample_ids}
    carried = {s[0] for g in kept["carry"] for s in g[4]}
    assert carried <= trained_after  # the carried groups were trained after the resume, not lost


def test_resuming_a_partial_checkpoint_without_partial_rollout_is_refused(tmp_path):
    run = str(tmp_path / "run")
    job = prepare(None, overrides(*PARTIAL, "run.steps=2", "run.checkpoint_every=1"), run, None)
    assert job.run() == 0
    from dynarl.launch.train import UsageError
    with pytest.raises(UsageError, match="rollout.oversample"):
        prepare(None, [("rollout.oversample", 1.0), ("algorithm.max_staleness", 0), ("run.steps", 3)], None, run)


# --- with the dynarl scheduler ----------------------------------------------------------
JOB = ("runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3",
       "trainer.num_ranks=1", "rollout.max_new_tokens=48", "rollout.samples_per_prompt=8", "scheduler.policy=dynarl",
       "scheduler.dynarl.interval_s=0.02", "scheduler.dynarl.charge_move_cost=false",
       "scheduler.dynarl.trainer_profile=home", "scheduler.dynarl.pack=8", "scheduler.dynarl.theta=0.6")


def test_the_dynarl_scheduler_moves_devices_in_partial_steps_and_trains_every_sample_once(tmp_path):
    """The batch closes, the rollout's engines donate (Workload), the trainer grows (P2P),
    the placement is restored: every sample trained once, none staler than the bound."""
    run_dir = str(tmp_path / "run")
    job = prepare(None, overrides(*JOB, *PARTIAL, "run.steps=3"), run_dir, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in (w.g.rollout, w.g.inference, w.g.trainer) for p in group.pids])
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert any(r["migrations"] for r in rows)  # devices moved inside the partial steps
    assert all(r["carried_groups"] >= 1 for r in rows)
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    ids = [i for e in entries for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == 3 * N_PROMPTS * 8
    assert all(0 <= e.step - v <= 1 for e in entries for v in e.versions)


def test_the_dynarl_scheduler_at_k_2_survives_kill_9_and_trains_every_sample_once_within_it(tmp_path):
    """`algorithm.max_staleness=2 scheduler.policy=dynarl` (rollout.oversample left out:
    1.5): killed mid-run, resumed from its checkpoint with the carried groups; every
    sample trained once, none more than 2 versions behind, none started again."""
    steps, every = 6, 3
    run = str(tmp_path / "run")
    argv = [sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, *JOB, "algorithm.max_staleness=2",
            f"run.steps={steps}", f"run.checkpoint_every={every}", "run.keep_checkpoints=5", "--run-dir", run]
    killed_after = kill_9_mid_run(argv, run, every + 1, tmp_path)
    assert every + 1 <= killed_after < steps
    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "--resume", run],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    check_ledger(run, steps, k=2, samples=8)
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert all(r["regenerated_groups"] == 0 for r in rows)
    assert max(r["staleness_max"] for r in rows) >= 1  # carried groups trained on newer weights
