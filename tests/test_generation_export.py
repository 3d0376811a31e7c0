"""A Workload migration's export while a real engine's abort races a request's last
token: the request finishes instead of being exported, and its result comes from the
engine's next step() (ExternalEngine.export_inflight). Found by the SGLang real-engine
train test (KeyError in Generation._finished): the group's count must hold."""
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


def test_a_request_that_finishes_while_exported_is_recorded_and_its_group_moves_without_it():
    async def go():
        engine = RacingEngine()
        await engine.update_weights(None, 0)
        box = Outbox()
        run = Generation(engine, box, 1, {"max_new_tokens": 1000})
        samples = [Sample(f"g0/{k}", k, max_new_tokens=n) for k, n in enumerate([300, 400, 500])]
        group = PromptGroup(0, "p0", "", [3, 4, 5], samples)
        fetch = asyncio.ensure_future(run.fetch(Inbox([group, END])))
        drive = asyncio.ensure_future(run.drive(fetch))
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
