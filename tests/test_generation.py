"""One step's generation on a rollout rank (components/rollout/generation.py) where a
migration meets it: an export while a real engine's abort races a request's last token
(the request finishes instead, its result from the engine's next step(), as
ExternalEngine.export_inflight does: found by the SGLang real-engine train test as a
KeyError in Generation._finished), and a partial rollout's close on a rank a
rolled-back move left empty."""
import asyncio

from dynarl.components.experience import END, PromptGroup, Sample
from dynarl.components.rollout.base import GenerationResult
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.components.rollout.generation import Generation
from dynarl.core.virtual_time import run_virtual
from test_partial_rollout import Inbox, Outbox


class RacingEngine(EmulatedRolloutEngine):
    """The emulated engine, except that export_inflight lets the first in-flight request
    it would hand over finish meanwhile: reported by step(), as a real engine's is."""

    def __init__(self) -> None:
        super().__init__(EmulatedRolloutConfig())
        self.raced: list[GenerationResult] = []

    async def export_inflight(self):
        items = await super().export_inflight()
        first, rest = items[0], items[1:]
        self.raced.append(GenerationResult(first.request.request_id, list(first.request.prompt_token_ids),
                                           list(first.output_token_ids), list(first.output_logprobs),
                                           "stop", 0))
        return rest

    def has_work(self) -> bool:
        return bool(self.raced) or super().has_work()

    async def step(self):
        if self.raced:
            out, self.raced = self.raced, []
            return out
        return await super().step()


def started(engine, lengths):
    """A generation of one group with samples of `lengths`, driven; (run, group, box, drive)."""
    box = Outbox()
    run = Generation(engine, box, 1, {"max_new_tokens": 1000})
    samples = [Sample(f"g0/{k}", k, max_new_tokens=n) for k, n in enumerate(lengths)]
    group = PromptGroup(0, "p0", "", [3, 4, 5], samples)
    fetch = run.fetch_task = asyncio.ensure_future(run.fetch(Inbox([group, END])))
    return run, group, box, asyncio.ensure_future(run.drive(fetch))


def test_a_request_that_finishes_while_exported_is_recorded_and_its_group_moves_without_it():
    async def go():
        engine = RacingEngine()
        await engine.update_weights(None, 0)
        run, group, box, drive = started(engine, [300, 400, 500])
        await asyncio.sleep(1.0)  # virtual: mid-generation, every sample still running
        await run.pause()
        items = await run.export()
        run.control.go("resume")  # handed off: its drive loop ends
        await drive
        return items, group, box.chunks

    items, group, chunks = run_virtual(go())
    (item,) = items
    assert [r.request.request_id for r in item.inflight] == ["g0/1", "g0/2"]  # the raced one stays here
    assert group.samples[0].finish == "stop" and 0 < len(group.samples[0].output_ids) < 300
    assert not group.samples[1].finish and not group.samples[2].finish
    assert chunks == []  # the group is not whole here: the kept rank emits it


def test_a_partial_close_on_a_rank_a_rolled_back_move_left_empty_hands_back_nothing_and_ends_it():
    async def go():
        engine = EmulatedRolloutEngine(EmulatedRolloutConfig())
        await engine.update_weights(None, 0)
        run, group, box, drive = started(engine, [300, 400])
        await asyncio.sleep(1.0)  # virtual: mid-generation
        await run.pause()
        exported = await run.export()  # its work went to a kept rank ...
        run.control.go("hold")  # ... and the next move's workload_load holds it
        await run.resume()  # the move rolled back with this rank empty: handed_off
        assert run.control.state.phase == "handed_off" and run.control.held
        items = await run.close()  # the step has its batch
        await asyncio.wait_for(drive, 60)  # its loop ends
        return exported, items, run.control.state.phase

    exported, items, phase = run_virtual(go())
    assert len(exported) == 1 and items == [] and phase == "closed"
