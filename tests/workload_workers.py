"""A rollout worker driven step by step, for the Workload migration tests."""
import torch

import dynarl
from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.base import GenerationRequest, InflightRequest, SamplingParams
from dynarl.components.rollout.native.engine import NativeEngineConfig, NativeRolloutEngine


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

    async def workload_export(self) -> list[dict]:
        if self.fail_export is True or (isinstance(self.fail_export, list) and self.rank in self.fail_export):
            raise RuntimeError("export failed (fault injection)")
        return [{"id": item.request.request_id, "weight": item.request.sampling.max_new_tokens
                 - len(item.output_token_ids), "inflight": item.to_wire()}
                for item in await self.engine.export_inflight()]

    async def workload_load(self) -> float:
        if self.rank in self.fail_load:
            raise RuntimeError("load failed (fault injection)")
        self.held = True
        load = await self.engine.load()
        return float(load.num_running + load.num_waiting)

    def is_held(self) -> bool:
        return self.held

    def workload_import(self, items: list[dict]) -> int:
        refusing = [0] if self.fail_import is True else (self.fail_import or [])
        if items and self.rank in refusing:  # only the receiving side refuses
            raise RuntimeError("import refused (fault injection)")  # and stays held
        self.held = False
        self.engine.import_inflight([InflightRequest.from_wire(item["inflight"]) for item in items])
        return len(items)


from dynarl.components.rollout.worker import RolloutWorker  # noqa: E402


class RefusingRolloutWorker(RolloutWorker):
    """The real rollout worker, whose rank 1 refuses a non-empty import (a kept rank
    that fails to take work over)."""

    async def workload_import(self, items: list[dict]) -> list:
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
