"""A rollout worker driven step by step, for the Workload migration tests."""
import torch

import dynarl
from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.base import GenerationRequest, InflightRequest, SamplingParams
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.native.engine import NativeRolloutEngine
from dynarl.core.migration.records import Taken, WorkItem


def requests(prefix: str, count: int, max_new_tokens: int = 24) -> list[dict]:
    return [GenerationRequest(f"{prefix}{i}", [5 + i, 9, 7 + i], SamplingParams(max_new_tokens=max_new_tokens, seed=i)
                              ).to_wire() for i in range(count)]


class EngineWorker(dynarl.Worker):
    def __init__(self, fail_import: bool | list[int] = False, fail_export: bool | list[int] = False,
                 fail_load: list[int] = ()) -> None:
        """Fault injection: `fail_import` True refuses non-empty imports on rank 0, a
        list on those ranks; `fail_export` True on every rank, a list on those;
        `fail_load` on those ranks."""
        torch.manual_seed(0)
        self.engine = NativeRolloutEngine(Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"]),
                                          NativeEngineConfig(max_num_seqs=4))
        self.results: dict[str, list[int]] = {}
        self.fail_import = fail_import
        self.fail_export = fail_export
        self.fail_load = list(fail_load)
        self.held = False
        """Set by workload_load, cleared by any workload_import: a real rank's generate
        may not end while it is held (components/rollout/generation.py)."""

    def submit(self, reqs: list[dict]) -> int:
        for r in reqs:
            self.engine.add_request(GenerationRequest.from_wire(r))
        return len(reqs)

    async def run_steps(self, steps: int) -> int:
        for _ in range(steps):
            if not self.engine.has_work():
                break
            for result in await self.engine.step():
                self.results[result.request_id] = result.output_token_ids
        return len(self.results)

    def finished(self) -> dict:
        return self.results

    async def drain(self) -> dict:
        while self.engine.has_work():
            await self.run_steps(1)
        return self.results

    async def workload_pause(self) -> None:
        await self.engine.pause()

    def workload_commit(self) -> None:
        pass

    async def workload_resume(self) -> None:
        await self.engine.resume()

    async def workload_export(self) -> list[WorkItem]:
        if self.fail_export is True or (isinstance(self.fail_export, list) and self.rank in self.fail_export):
            raise RuntimeError("export failed (fault injection)")
        return [WorkItem(item.request.request_id, item.request.sampling.max_new_tokens - len(item.output_token_ids),
                         item.to_wire()) for item in await self.engine.export_inflight()]

    async def workload_load(self) -> float:
        if self.rank in self.fail_load:
            raise RuntimeError("load failed (fault injection)")
        self.held = True
        load = await self.engine.load()
        return float(load.num_running + load.num_waiting)

    def is_held(self) -> bool:
        return self.held

    def workload_import(self, items: list[WorkItem]) -> Taken:
        refusing = [0] if self.fail_import is True else (self.fail_import or [])
        if items and self.rank in refusing:  # only the receiving side refuses
            raise RuntimeError("import refused (fault injection)")  # and stays held
        self.held = False
        self.engine.import_inflight([InflightRequest.from_wire(item.body) for item in items])
        return Taken(len(items))


from dynarl.components.rollout.worker import RolloutWorker  # noqa: E402


class RefusingRolloutWorker(RolloutWorker):
    """The real rollout worker, whose rank 1 refuses a non-empty import (a kept rank
    that fails to take work over)."""

    async def workload_import(self, items: list[WorkItem]) -> Taken:
        if items and self.rank == 1:  # still held: the rollback's empty import lets it go
            raise RuntimeError("import refused (fault injection)")
        return await super().workload_import(items)


class SlowLinkRolloutWorker(RolloutWorker):
    """The real rollout worker, as if every KV transfer it made so far had cost 10 s
    (its measured link): with kv_choice "cost", re-prefilling always costs it less."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for fit in self.kv_links.values():
            fit.add(100, 10.0)


class DyingRolloutWorker(RolloutWorker):
    """Rank 1 SIGKILLs its own process in step 1's generation as soon as it holds a
    prompt group (nothing it made is flushed), once per run: the file named by
    $DYNARL_TEST_DIE_MARK marks that it died (its replacement, rank 1 again, lives)."""

    async def generate(self, get, put, *, version, chunk_size, sampling, prefetch=1):
        import os
        mark = os.environ.get("DYNARL_TEST_DIE_MARK")
        if self.rank != 1 or version != 1 or not mark or os.path.exists(mark):
            return await super().generate(get, put, version=version, chunk_size=chunk_size, sampling=sampling,
                                          prefetch=prefetch)
        import asyncio
        import signal
        task = asyncio.ensure_future(super().generate(get, put, version=version, chunk_size=chunk_size,
                                                      sampling=sampling, prefetch=prefetch))
        while (self.run is None or self.run.num_groups < 1) and not task.done():
            await asyncio.sleep(0.001)
        open(mark, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
        return await task


def _die_after_first_get(worker, get):
    """The worker SIGKILLs its own process once its next get from `get` returns (it
    holds that item), once per run ($DYNARL_TEST_DIE_MARK marks it); True if armed."""
    import os
    import signal
    mark = os.environ.get("DYNARL_TEST_DIE_MARK")
    if not mark or os.path.exists(mark):
        return False
    inbox = worker.channel(get)
    real_get = inbox.get

    async def get_then_die(key=None):
        item = await real_get(key)
        open(mark, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
        return item
    inbox.get = get_then_die
    return True


from dynarl.components.reward.worker import RewardWorker  # noqa: E402
from dynarl.components.inference.worker import InferenceWorker  # noqa: E402


class DyingRewardWorker(RewardWorker):
    """Rank 0 dies holding its first chunk of step 1 (its second call); the others live."""
    calls = 0

    async def score(self, get, put):
        type(self).calls += 1
        if type(self).calls == 2 and self.rank == 0:
            _die_after_first_get(self, get)
        return await super().score(get, put)


class DyingInferenceWorker(InferenceWorker):
    """Dies holding its first chunk of step 1."""

    async def compute_logprobs(self, get, put, *, version, split=False):
        if version == 1:
            _die_after_first_get(self, get)
        return await super().compute_logprobs(get, put, version=version, split=split)


class DyingInSyncRolloutWorker(RolloutWorker):
    """Rank 1 SIGKILLs its own process as the weight sync after step 1 (version 2)
    starts sending to it, once per run ($DYNARL_TEST_DIE_MARK)."""

    async def receive_weights(self, group, version):
        import os
        import signal
        mark = os.environ.get("DYNARL_TEST_DIE_MARK")
        if self.rank == 1 and version == 2 and mark and not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return await super().receive_weights(group, version)
