NUM_GPUS = 0
"""Partial rollout of agentic episodes (rollout.oversample > 1 with workflow agentic):
the step closes its batch on the N-th group scored; every episode not over then waits
in its sample for a later step, the turn it was in cut where it was (its tokens and
the version that made them kept, the rest generated later on newer weights) or its
next turn not yet sent; the groups carried go into the checkpoint. Every episode is
trained once, none staler than the bound, and a run killed mid-step resumes with the
carried episodes."""

import asyncio
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import assert_reaped, kill_9_mid_run
from dynarl.components.experience import END
from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.rollout.base import GenerationRequest, InflightRequest
from dynarl.components.rollout.run_control import Unfinished
from dynarl.components.workflows.agentic import episode_of, fill_sample, keep_unfinished
from dynarl.components.workflows.episodes import Episode, EpisodeDriver, EpisodeState
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from dynarl.components.rollout.turn import TurnRequest, TurnResult
from test_agentic_train import ARGS, PROMPTS, SAMPLES
from test_partial_rollout import Outbox  # (a rank's outbox: what it puts, in order)

PARTIAL = ["rollout.oversample=1.5", "algorithm.max_staleness=1"]


def _handed_back(turn_id, version, tokens, logprobs):
    """A turn a rank's partial_close handed back: its tokens so far, made by `version`."""
    request = InflightRequest(GenerationRequest(turn_id, [1]), tokens, logprobs)
    return Unfinished(id=turn_id, weight=float(len(tokens)), inflight=[request], version=version)


def _pairs(args):
    return [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in args)]


# --- an episode's state across steps ---------------------------------------------------------
def test_an_unfinished_episode_waits_in_its_sample_and_comes_back_as_it_was():
    ep = Episode("e/0", [1, 2], 7, response=[5, 6, 9, 9], mask=[1, 1, 0, 0], logprobs=[-0.1, -0.2, 0.0, 0.0],
                 turns=1, tool_calls=1, group=3, segments=[[0, 2, 4]], pending=[[8, 8, 8], [-0.3] * 3, [[3, 5]]])
    sample = Sample("e/0", 7)
    keep_unfinished(sample, ep)
    # the pending turn's 3 tokens count as a segment past the response: the sample is as old as version 4
    assert sample.segments == [[0, 2, 4], [4, 7, 5]] and not sample.finish
    group = PromptGroup.from_json(json.loads(json.dumps(PromptGroup(3, "p", "a", [1, 2], [sample]).to_json())))
    back = episode_of(group.samples[0], group)
    assert (back.response, back.mask, back.logprobs, back.turns, back.tool_calls, back.group) == \
        (ep.response, ep.mask, ep.logprobs, 1, 1, 3)
    assert back.segments == [[0, 2, 4]] and back.pending == [[8, 8, 8], [-0.3] * 3, [[3, 5]]] and back.oldest == 4
    # its turn done on newer weights: the turn's tokens split by version; the sample's version is the oldest
    fill_sample(group.samples[0], back, "", scored=False)
    assert group.samples[0].version == 4 and group.samples[0].episode is None
    group.samples[0].restart()  # over the staleness bound: it starts again from its first turn
    assert group.samples[0].episode is None and group.samples[0].mask is None
    assert episode_of(group.samples[0], group).turns == 0
    with pytest.raises(ValueError, match="episode's state"):
        EpisodeState.from_wire([1, 2, 3])


def test_a_closing_driver_parks_every_episode_and_continues_a_cut_turn_with_its_tokens():
    """Two episodes on one rank: the step closes while e/0's turn runs (cut: 2 tokens so
    far) and e/1's tool call is under way (once it is in, its next turn is parked, not
    sent); the next run continues e/0's turn from its tokens and records which weights
    made which."""

    async def main():
        sent, ended = [], []
        tool = asyncio.Event()

        async def submit(key, turn):
            sent.append(turn)

        async def end(key):
            ended.append(key)

        class Turns:
            calls_by_tool = {}

            def budget(self, ep):
                return 4

            def tool_count(self, ep):
                return ep.tool_calls

            async def reply(self, ep, out, finish):
                if ep.id == "e/1":
                    await tool.wait()  # its tool call runs across the close
                return None if ep.turns >= 2 else [0]  # an observation, then a second turn ends it

        driver = EpisodeDriver(Turns(), ["r"], submit, end=end)
        results: asyncio.Queue = asyncio.Queue()
        eps = [Episode("e/0", [1], 0), Episode("e/1", [1], 1)]
        run = asyncio.ensure_future(driver.run(eps, results.get))
        await asyncio.sleep(0)
        await results.put(TurnResult(id="e/1#0", output_ids=[3, 3], logprobs=[-1.0, -1.0], finish="stop",
                           version=4, cached_tokens=0, wait_s=0.0))
        await asyncio.sleep(0.01)
        await driver.stop()
        driver.cut([_handed_back("e/0#0", 4, [7, 7], [-0.5, -0.5])])
        await asyncio.sleep(0.01)
        assert not run.done()  # e/1's tool call is still under way
        tool.set()
        await asyncio.wait_for(run, 1.0)
        assert set(driver.parked) == {"e/0", "e/1"} and len(sent) == 2 and ended == ["r"]
        assert eps[0].pending == [[7, 7], [-0.5, -0.5], [[2, 4]]] and eps[1].turns == 1 and eps[1].pending is None
        # the next step: e/0's turn goes out with its tokens so far, and is cut again (one more
        # token, by version 5): its first two tokens stay version 4's
        nxt = EpisodeDriver(Turns(), ["r"], submit, end=end)
        run = asyncio.ensure_future(nxt.run([eps[0]], asyncio.Queue().get))
        await asyncio.sleep(0)
        assert sent[-1].id == "e/0#0" and sent[-1].partial == [[7, 7], [-0.5, -0.5]]
        await nxt.stop()
        nxt.cut([_handed_back("e/0#0", 5, [7, 7, 8], [-0.5, -0.5, -0.3])])
        await asyncio.wait_for(run, 1.0)
        assert eps[0].pending[2] == [[2, 4], [3, 5]] and eps[0].oldest == 4
        # the step after: the turn ends on version 6, each run with the weights that made it
        last = EpisodeDriver(Turns(), ["r"], submit, end=end)
        results = asyncio.Queue()
        run = asyncio.ensure_future(last.run([eps[0]], results.get))
        await asyncio.sleep(0)
        await results.put(TurnResult(id="e/0#0", output_ids=[7, 7, 8, 2], logprobs=[-0.5, -0.5, -0.3, -0.1],
                           finish="stop", version=6, cached_tokens=0, wait_s=0.0))
        await asyncio.sleep(0.01)
        assert eps[0].segments == [[0, 2, 4], [2, 3, 5], [3, 4, 6]] and eps[0].pending is None
        assert eps[0].oldest == 4
        await results.put(TurnResult(id="e/0#1", output_ids=[9], logprobs=[-0.2], finish="stop",
                           version=6, cached_tokens=0, wait_s=0.0))
        await asyncio.wait_for(run, 1.0)
        assert last.finished == [eps[0]] and eps[0].response == [7, 7, 8, 2, 0, 9]
    from dynarl.core.virtual_time import run_virtual
    run_virtual(main())  # virtual time: a sleep lets all that can run run first; no wall-clock bound


def test_the_plan_restarts_a_stale_episode_from_its_first_turn_and_resumes_a_fresh_one():
    from dynarl.components.workflows.partial import plan
    stale, fresh = Sample("g/0", 0), Sample("g/1", 1)
    for sample, version in ((stale, 0), (fresh, 1)):
        ep = Episode(sample.id, [1], sample.seed, response=[5, 9], mask=[1, 0], logprobs=[-0.1, 0.0], turns=1,
                     tool_calls=1, group=0, segments=[[0, 1, version]])
        keep_unfinished(sample, ep)
    group = PromptGroup(0, "p", "a", [1], [stale, fresh])
    p = plan([group], [], step=2, num_groups=4, max_staleness=1)
    assert p.inflight == [group] and p.regenerated_groups == 1 and p.regenerated_tokens == 2
    restarted, resumed = (episode_of(s, group) for s in group.samples)
    assert (restarted.turns, restarted.response, restarted.mask) == (0, [], [])
    assert (resumed.turns, resumed.response, resumed.segments) == (1, [5, 9], [[0, 1, 1]])
    assert resumed.computed == 3  # its context's KV was an earlier step's: computed again, counted


# --- a rollout rank cuts a turn and the next step continues it ---------------------------------
class KeyedInbox:
    def __init__(self, items):
        self.items = list(items)

    async def get(self, key=None):
        while not self.items:
            await asyncio.sleep(0.01)
        return self.items.pop(0)


def test_a_cut_turn_comes_back_with_its_tokens_and_the_next_step_finishes_it():
    """A rank serving two turns on an emulated engine is cut once the short one is done:
    the long one comes back with its tokens so far; the next step's rank takes it with
    them and generates only the rest, on its own weights."""
    from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
    from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
    from dynarl.components.workflows.agentic_rollout import _TurnServe
    from dynarl.core.virtual_time import run_virtual

    def turn(rid, n, partial=None):
        item = TurnRequest(id=rid, prompt_ids=[3, 4, 5], seed=1, tool_count=0, max_new_tokens=n)
        return item if partial is None else dataclasses.replace(item, partial=partial)

    async def two_steps():
        engine = EmulatedRolloutEngine(EmulatedRolloutConfig())
        await engine.update_weights(None, 0)
        box = Outbox()
        first = _TurnServe(engine, box, "r", {}, 1.0)
        inbox = KeyedInbox([turn("a#0", 20), turn("b#0", 400), END])
        fetch = first.fetch_task = asyncio.ensure_future(first.fetch(inbox))
        serve = asyncio.ensure_future(first.serve(fetch))
        while not box.chunks:  # a's turn is done; b's is still going
            await asyncio.sleep(0.01)
        await first.pause()
        (item,) = await first.export()
        await serve
        await engine.resume()
        request = item.inflight[0]
        so_far = [list(request.output_token_ids), list(request.output_logprobs)]
        assert item.id == "b#0" and 0 < len(so_far[0]) < 400 and [r.id for r in box.chunks] == ["a#0"]

        await engine.update_weights(None, 1)
        box2 = Outbox()
        second = _TurnServe(engine, box2, "r", {}, 1.0)
        fetch = asyncio.ensure_future(second.fetch(KeyedInbox([turn("b#0", 400, so_far), END])))
        await second.serve(fetch)
        return so_far[0], second.num_tokens, box2.chunks

    so_far, made_second, results = run_virtual(two_steps())
    (done,) = results
    assert len(done.output_ids) == 400 and done.output_ids[:len(so_far)] == so_far
    assert done.version == 1 and made_second == 400 - len(so_far)  # only the rest made in the next step


# --- dynarl train ------------------------------------------------------------------------------
def check_ledger(run_dir, steps):
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == list(range(steps))
    ids = [i for e in entries for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == steps * PROMPTS * SAMPLES  # every episode once, each step whole
    for e in entries:
        assert all(0 <= e.step - v <= 1 for v in e.versions), e.step
    return entries


def test_a_partial_agentic_run_carries_episodes_and_trains_each_once(tmp_path):
    run_dir = str(tmp_path / "run")
    job = prepare(None, _pairs([a for a in ARGS if not a.startswith("run.steps")] + PARTIAL + ["run.steps=3"]),
                  run_dir, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in (w.g.rollout, w.g.inference, w.g.trainer, w.tools) for p in group.pids])
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert all(r["carried_groups"] >= 1 for r in rows)  # 6 groups play, 4 train: some carried each step
    assert all(r["samples"] == PROMPTS * SAMPLES for r in rows)
    assert rows[0]["staleness_max"] == 0 and max(r["staleness_max"] for r in rows) <= 1
    check_ledger(run_dir, 3)


def test_kill_9_mid_step_then_resume_trains_the_carried_episodes_once(tmp_path):
    steps, every = 5, 2
    run = str(tmp_path / "run")
    argv = [sys.executable, "-m", "dynarl.launch.cli", "train", *[a for a in ARGS if not a.startswith("run.steps")],
            *PARTIAL, f"run.steps={steps}", f"run.checkpoint_every={every}", "run.keep_checkpoints=5",
            "--run-dir", run]
    killed_after = kill_9_mid_run(argv, run, every + 1, tmp_path)
    assert every + 1 <= killed_after < steps
    checkpoint = os.path.join(run, "checkpoints", f"step_{every:06d}")
    kept = json.load(open(os.path.join(checkpoint, "partial.json")))
    assert kept["carry"]  # episodes started and not yet trained
    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "--resume", run],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"resumed from {checkpoint}" in result.stdout
    entries = check_ledger(run, steps)
    trained_after = {i for e in entries if e.step >= every for i in e.sample_ids}
    carried = {s[0] for g in kept["carry"] for s in g[4]}
    assert carried <= trained_after  # the carried episodes were trained after the resume, not lost
