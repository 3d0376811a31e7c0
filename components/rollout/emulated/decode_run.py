"""A run of decode steps over an unchanged batch, spent in one sleep.

Step k of the run (k = 1..steps) ends at start + time_of(k) · time_scale, where
time_of(k) = first + decode_steps_time(batch, context, k) and `first` is what the
first step pays besides decoding (prefill, a pending weight sync). So a run of k
steps ends exactly when k single steps would, and at any moment the number of
steps already completed is known (completed_by), which is what lets the engine
stop a run early, at a step boundary, when something outside changes the batch.
"""
from __future__ import annotations

import asyncio

from dynarl.components import costmodel


class DecodeRun:
    def __init__(self, loop: asyncio.AbstractEventLoop, first: float, batch: int, mean_context: float,
                 steps: int, model: costmodel.ModelShape, device: costmodel.DeviceSpec, tp: int,
                 time_scale: float):
        self.loop = loop
        self.start = loop.time()
        self.first = first
        self.batch = batch
        self.mean_context = mean_context
        self.steps = steps
        """Steps this run will take; shortened by stop_after()."""
        self.done = 0
        """Steps already applied to the scheduler (catch-up while the run is in flight)."""
        self._cost = (model, device, tp)
        self.time_scale = time_scale
        self.finished = loop.create_future()
        self._timer = loop.call_at(self._end_of(steps), self._wake)

    def time_of(self, k: int) -> float:
        """Cost-model seconds from the start of the run to the end of step k."""
        if k <= 0:
            return 0.0
        model, device, tp = self._cost
        return self.first + costmodel.decode_steps_time(model, device, self.batch, self.mean_context, k, tp)

    def completed_by_now(self) -> int:
        """Steps that have ended by the loop's current time; the last one is left for the
        run's own wake-up, which returns its finished requests."""
        if self.time_scale == 0:
            return self.done
        elapsed = (self.loop.time() - self.start) / self.time_scale
        lo, hi = self.done, self.steps - 1  # largest k in [lo, hi] with time_of(k) <= elapsed
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.time_of(mid) <= elapsed:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def stop_after(self, steps: int) -> None:
        """End the run after `steps` steps (not before the step in flight)."""
        if steps < self.steps:
            self.steps = steps
            self._timer.cancel()
            self._timer = self.loop.call_at(self._end_of(steps), self._wake)

    def cancel(self) -> None:
        self._timer.cancel()

    def _end_of(self, k: int) -> float:
        return self.start + self.time_of(k) * self.time_scale

    def _wake(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)
