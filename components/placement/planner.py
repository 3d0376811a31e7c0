"""RLinf's planner: a dynamic program over cuts of the workflow chain.

A plan cuts the chain c_0..c_{k-1} into segments, each on its own devices; the
components of a segment time-share them (colocated), segments stream to each
other (spatial). A segment c_i..c_j on n devices has a *head*, its first
component, which consumes its input as it streams in, and a *rest*, the later
components, which run after the head has seen everything (they share its devices):

    head = t_{c_i}(n),   rest = sum_{c_i < c <= c_j} t_c(n), plus one role switch
                                per component when the segment has more than one

t_c from the profiles. What a segment passes on is a stream: the window [s, f]
over which its output appears. With the upstream's stream over [s, f] (w = f - s)
and M micro-batches, the head ends at

    max(f, s + head) + min(w, head) / M

(a two-stage pipeline of M equal micro-batches: M - 1 slots of the slower stage
plus one of each) and the segment at that plus rest. Its own output window opens
with its input (s) when the head is all there is, else when its last component
starts: a time-shared segment emits nothing until its earlier components finish.
The first segment's input is all there at time 0.

Both ends of a window only delay what follows, so for every prefix c_0..c_j on n
devices the search keeps the windows no other window beats at both ends (a Pareto
set, a handful), extends each by every segment c_{j+1}..c_l on every device
count, and the plan is the earliest end over the whole chain on N devices.
Device counts run over a grid of `step` devices (a multiple of every component's
granularity that divides N, at most 64 points): O(k^2 * grid^2) per kept window.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from dynarl.components.placement.plan import COMPONENTS, Placement, Segment
from dynarl.components.placement.profile import StageProfile

MAX_GRID = 64


@dataclass(frozen=True, slots=True)
class PlanResult:
    placement: Placement
    predicted_s: float
    """The plan's predicted iteration time."""
    stage_s: dict[str, float]
    """Each component's profiled time at its allocation."""
    evaluated: int
    """(segment, devices, prefix) candidates the search evaluated."""


def grid_step(num_devices: int, granularity: Mapping[str, int]) -> int:
    unit = math.lcm(*(granularity.get(c, 1) for c in COMPONENTS))
    if num_devices % unit:
        raise ValueError(f"{num_devices} devices are not a multiple of the granularity {unit}")
    k = unit
    while k <= num_devices:
        if num_devices % k == 0 and num_devices // k <= MAX_GRID:
            return k
        k += unit
    return num_devices


def segment_window(upstream: tuple[float, float] | None, head_s: float, rest_s: float, last_s: float,
                   micro_batches: int) -> tuple[float, float]:
    """(start, end) of a segment's output stream, given its upstream's (None: input all
    there at 0). last_s: its last component's time (the part of rest that emits)."""
    if upstream is None:
        begin, head_end = 0.0, head_s
    else:
        begin, f = upstream
        head_end = max(f, begin + head_s) + min(f - begin, head_s) / micro_batches
    end = head_end + rest_s
    return (begin if rest_s == 0 else end - last_s), end


def _pareto(windows: list[tuple[float, float, tuple[Segment, ...]]]) -> list[tuple[float, float, tuple[Segment, ...]]]:
    kept: list[tuple[float, float, tuple[Segment, ...]]] = []
    for w in sorted(windows, key=lambda w: (w[1], w[0])):
        if all(w[0] < k[0] - 1e-12 for k in kept):  # later end: only useful with an earlier start
            kept.append(w)
    return kept


def plan(profiles: Mapping[str, StageProfile], num_devices: int, *, granularity: Mapping[str, int] | None = None,
         switch_s: float = 0.0, micro_batches: int = 8) -> PlanResult:
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    missing = [c for c in COMPONENTS if c not in profiles]
    if missing:
        raise ValueError(f"no profile for {missing}")
    step = grid_step(num_devices, granularity or {})
    chain, k = COMPONENTS, len(COMPONENTS)
    grid = range(step, num_devices + 1, step)
    # front[j][n]: Pareto windows (start, end, segments) of the prefix c_0..c_j on n devices
    front: list[dict[int, list]] = [{} for _ in range(k)]
    evaluated = 0
    for j in range(k):
        for n in grid:
            windows = []
            for i in range(j + 1):
                shared = j > i
                prefixes: list = [(None, ())]
                for m in grid:
                    if m > n or (i == 0 and m != n):
                        continue
                    if i > 0:
                        prefixes = [((s, f), segs) for s, f, segs in front[i - 1].get(n - m, [])]
                    times = [profiles[chain[c]].time_at(m) + (switch_s if shared else 0.0) for c in range(i, j + 1)]
                    for upstream, segs in prefixes:
                        evaluated += 1
                        start, end = segment_window(upstream, times[0], sum(times[1:]), times[-1], micro_batches)
                        windows.append((start, end, segs + (Segment(chain[i:j + 1], m),)))
            if windows:
                front[j][n] = _pareto(windows)
    _, predicted, segments = min(front[k - 1][num_devices], key=lambda w: (w[1], w[0]))
    placement = Placement(segments)
    stage_s = {c: profiles[c].time_at(placement.num_devices_of(c)) for c in chain}
    return PlanResult(placement, predicted, stage_s, evaluated)
