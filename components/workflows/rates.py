"""Where the DynaRL predictor's throughput points come from (core/scheduler/loop.py
RateSource; tokens per second): the engines' own profile.

    CostModelRates   emulated engines (`dynarl sim`): the cost model they run on
                     (components/costmodel.py) is their profile
    MeasuredRates    real engines (`dynarl train`): the trainer timed on warm standby
                     ranks at start (its level corrected by every step), the rollout's
                     decode step and inference's rate measured in each step

The rollout's points price consolidation: with `active` requests on e engines each
decodes a batch of ceil(active / e) (at most max_num_seqs), so fewer engines lose
little while decode stays memory-bound; the static components scale linearly.
"""
from __future__ import annotations

import math

from dynarl.components import costmodel as cm
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel
from dynarl.core.scheduler.view import RolloutProgress, StepWork, sequence_mean

ENGINE_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
"""Engine counts the rollout's points are given at (and at every engine)."""
PROFILE_TOKENS = 1_000_000
"""A batch of this many tokens prices the static components' rates."""


def trainer_passes(critic: bool) -> float:
    """Training steps' worth of work per trained token on the trainer's devices: 1, or
    with a critic of the policy's size beside it (ppo) its forward pass (a third of a
    step, cm.LOGPROB_SPEEDUP) and its own step too."""
    return 1.0 + (1.0 + 1.0 / cm.LOGPROB_SPEEDUP) * critic


def rollout_points(engines: int, tp: int, active: int, max_seqs: int, step_s) -> tuple[tuple[int, float], ...]:
    """(devices, tokens/s) at several engine counts: each engine decodes its share of the
    active requests per step of `step_s(batch)` seconds."""
    points = []
    for e in sorted({*ENGINE_COUNTS, engines} - {0}):
        if e > engines:
            continue
        b = max(1, min(max_seqs, math.ceil(active / e))) if active else 1
        points.append((e * tp, e * b / step_s(b)))
    return tuple(points)


class CostModelRates:
    def __init__(self, *, model: str, device: str, tp: int, devices: int, max_seqs: int,
                 mfu: float = cm.DEFAULT_MFU, recompute: bool = False, trainer_passes: float = 1.0) -> None:
        self.model, self.device = cm.get_model(model), cm.get_device(device)
        self.tp, self.devices, self.max_seqs = tp, devices, max_seqs
        self.mfu, self.recompute = mfu, recompute
        self.trainer_passes = trainer_passes
        """Training steps' worth of work per trained token on the trainer's devices (ppo:
        its critic's forward and step follow it there: trainer_passes())."""

    def predictor(self, work: StepWork, p: RolloutProgress) -> Predictor:
        context = max(work.prompt_mean + p.made, 1.0)
        rollout = rollout_points(self.devices // self.tp, self.tp, p.active, self.max_seqs,
                                 lambda b: cm.decode_step_time(self.model, self.device, b, context, self.tp))
        seq = sequence_mean(work, p)
        n = self.devices
        t1 = PROFILE_TOKENS / cm.train_time(self.model, self.device, PROFILE_TOKENS, seq, 1, self.mfu,
                                            self.recompute) / self.trainer_passes
        i1 = PROFILE_TOKENS / cm.logprob_time(self.model, self.device, PROFILE_TOKENS, seq, 1)
        return Predictor({"rollout": ThroughputModel(list(rollout)),
                          "trainer": ThroughputModel([(1, t1), (n, t1 * n)]),
                          "inference": ThroughputModel([(1, i1), (n, i1 * n)])})


class MeasuredRates:
    def __init__(self, *, tp: int, devices: int, max_seqs: int, trainer_passes: float = 1.0) -> None:
        self.tp, self.devices, self.max_seqs = tp, devices, max_seqs
        self.trainer_passes = trainer_passes
        """As CostModelRates'; the profile and the measurements are of the trainer's step
        alone (a step's measured rate is per pass: its tokens x passes over its time)."""
        self.step_s: float | None = None
        """The rollout engines' mean decode step, as measured (None: not yet)."""
        self.models: dict[str, ThroughputModel] = {}
        """trainer: profiled at start (profile_trainer); inference: from each step."""

    def predictor(self, work: StepWork, p: RolloutProgress) -> Predictor:
        models = dict(self.models)
        if self.trainer_passes != 1.0 and "trainer" in models:
            t = models["trainer"]
            models["trainer"] = ThroughputModel([(d, r / self.trainer_passes) for d, r in t.points], t.correction)
        step_s = p.step_s or self.step_s
        if step_s:
            models["rollout"] = ThroughputModel(list(rollout_points(
                self.devices // self.tp, self.tp, p.active, self.max_seqs, lambda b: step_s)))
        return Predictor(models)

    def profile_trainer(self, points: list[tuple[int, float]]) -> None:
        self.models["trainer"] = ThroughputModel(points)

    def learn_step(self, *, step_s: float | None, trainer: tuple[int, float] | None,
                   inference: tuple[int, float] | None) -> None:
        """A step's measurements: the decode step; (devices, tokens/s) of the trainer's
        step (it corrects the profile's level; the profiled shape across device counts
        stays) and of inference (its model: linear from there)."""
        if step_s:
            self.step_s = step_s
        if trainer is not None and trainer[1] > 0:
            if "trainer" in self.models:
                self.models["trainer"].observe(*trainer)
            else:  # no profile (none fit beside the job): linear from the first step's
                self.models["trainer"] = ThroughputModel([trainer])
        if inference is not None and inference[1] > 0:
            self.models["inference"] = ThroughputModel([inference])
