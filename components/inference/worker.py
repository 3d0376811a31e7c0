"""InferenceWorker: log-probs of the old policy (and of the reference policy when
the loss has a KL term) for every sample, chunk by chunk.

The old policy is the rollout's: both receive the same weights from the trainer
after every step, so recomputing here (a full forward, as the trainer computes
its own log-probs) keeps the PPO ratio exactly 1 at the first update instead of
carrying the small numerical gap between paged decoding and a full forward. The
reference policy is frozen at the first weights received (after warm start).

The engine (engine_factory: native torch, or emulated with cost-model time) does
the computing. A teacher (algorithm.teacher, for on-policy distillation) is an engine
of its own on the same ranks, built from its own model spec at start and never
synced: it scores every sample too (teacher_logprobs). Every chunk's rollout
log-probs are measured against old_logprobs (and the teacher's against them:
inference/gap.py), and the rank's step reports the sums. With `split`, each scored
sample goes downstream as a group of its own: GRPO samples are independent once
their advantages are known, so a streaming trainer's data-parallel ranks can balance
them one by one.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import dynarl
from dynarl.components.busy import BusyLog
from dynarl.components.model.spec import ModelSpec
from dynarl.components.experience import END, Sample, made_of
from dynarl.components.inference.gap import LogprobGap, logprob_gap
from dynarl.components.stale_weights import StaleWeights
from dynarl.components.stage_results import InferenceStats
from dynarl.core.scheduler.report import RankReport


class InferenceWorker(dynarl.Worker):
    def __init__(self, model: ModelSpec, micro_batch_size: int, with_ref: bool, bucket_bytes: int,
                 shares_device: bool = False, backend: str = "native", backend_config: Any = None,
                 teacher: ModelSpec | None = None) -> None:
        """`backend_config`: an EmulatedInferenceConfig for the emulated backend; `teacher`:
        the model whose log-probs go on every sample as teacher_logprobs (None: none)."""
        from dynarl.components.engine_factory import make_inference_engine
        self.engine = make_inference_engine(backend, model, micro_batch_size, backend_config, self.device)
        self.teacher = None if teacher is None else make_inference_engine(
            backend, teacher, micro_batch_size, backend_config, self.device)
        self.measures_gap = backend != "emulated"
        """Real log-probs on both sides (an emulated engine's are synthetic: never built for a gap)."""
        self.with_ref = with_ref
        self.has_ref = False
        self.bucket_bytes = bucket_bytes
        self.shares_device = shares_device
        self.samples_done = self.tokens_done = 0
        """This step's scored samples and their sequence tokens (the scheduler's view)."""

    async def onload(self) -> None:
        if self.shares_device:
            await self._engines("onload")

    async def offload(self) -> None:
        if self.shares_device:
            await self._engines("offload")

    async def _engines(self, method: str) -> None:
        """`method` of the policy's engine and the teacher's."""
        for engine in (self.engine, self.teacher):
            if engine is not None:
                await getattr(engine, method)()

    async def release_devices(self) -> None:
        """Its stage is over for the step and its devices go to the barrier stage
        (core/migration/mover.py): the engine offloads; the rank stays in its group."""
        await self._engines("offload")

    async def reclaim_devices(self) -> None:
        """The step is over: the devices are back, and so is the engine."""
        await self._engines("onload")

    def weight_version(self) -> int:
        """The policy version this rank's engine holds (-1: none yet)."""
        return self.engine.weight_version

    async def receive_weights(self, group: str, version: int) -> int:
        from dynarl.components import weight_sync
        await weight_sync.receive_async(self.process_group(group), self.engine.weights_template, self.bucket_bytes,
                                        self.engine.weight_version, version, self.engine.update_weights, self.device)
        return version

    async def load_reference(self, path: str) -> None:
        """The frozen reference policy (needed when with_ref)."""
        await self.engine.load_reference(path)
        self.has_ref = True

    def metrics(self) -> RankReport:
        return RankReport(samples=self.samples_done, tokens=self.tokens_done)

    async def compute_logprobs(self, get: str, put: str, *, version: int, split: bool = False) -> InferenceStats:
        """Consumes scored chunks from `get` until END; puts them on `put` with
        old_logprobs (and ref_logprobs, teacher_logprobs) on every sample."""
        if self.engine.weight_version != version:
            raise StaleWeights(f"inference holds weights v{self.engine.weight_version}, "
                                           f"the step needs v{version}")
        if self.with_ref and not self.has_ref:
            raise RuntimeError("with_ref is set but no reference policy was loaded (load_reference)")
        inbox, outbox = self.channel(get), self.channel(put)
        loop = asyncio.get_running_loop()
        busy = BusyLog()
        self.samples_done = self.tokens_done = 0
        rollout_gaps: list[LogprobGap] = []
        teacher_gaps: list[LogprobGap] = []
        while (chunk := await inbox.get()) is not END:
            samples = [(g, s) for g in chunk for s in g.samples]
            prompts = [g.prompt_ids for g, _ in samples]
            responses = [s.output_ids for _, s in samples]
            begun = loop.time()
            old = await self.engine.logprobs(prompts, responses)
            ref = await self.engine.logprobs(prompts, responses, reference=True) if self.with_ref else None
            taught = await self.teacher.logprobs(prompts, responses) if self.teacher is not None else None
            busy.add(begun, loop.time())
            for i, (_, s) in enumerate(samples):
                s.old_logprobs = old[i]
                if ref is not None:
                    s.ref_logprobs = ref[i]
                if taught is not None:
                    s.teacher_logprobs = taught[i]
            if self.measures_gap:
                rollout_gaps += [_gap(s, s.logprobs, s.old_logprobs) for _, s in samples]
                if taught is not None:
                    teacher_gaps += [_gap(s, s.old_logprobs, s.teacher_logprobs) for _, s in samples]
            self.samples_done += len(samples)
            self.tokens_done += sum(len(p) + len(r) for p, r in zip(prompts, responses))
            held = made_of(inbox, chunk)  # (a chunk in custody goes downstream whole, in one message)
            if split and held:
                await outbox.put_all([[dataclasses.replace(g, samples=[s])] for g, s in samples], held["made_of"])
            elif split:
                for g, s in samples:
                    await outbox.put([dataclasses.replace(g, samples=[s])])
            else:
                await outbox.put(chunk, weight=len(chunk), **held)
        await outbox.flush()
        return InferenceStats(samples=self.samples_done, tokens=self.tokens_done, busy=busy.intervals,
                              rollout_gap=LogprobGap.merge(rollout_gaps) if self.measures_gap else None,
                              teacher_gap=LogprobGap.merge(teacher_gaps) if self.teacher is not None
                              and self.measures_gap else None)


def _gap(sample: Sample, sampler: Any, other: Any) -> LogprobGap:
    """One sample's gap over its loss tokens (mask 1; a sample without a mask: all)."""
    try:
        return logprob_gap(list(sampler), list(other), sample.mask)
    except ValueError as exc:
        raise ValueError(f"sample {sample.id}: {exc}") from None
