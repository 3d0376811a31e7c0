"""decide_dynarl's greedy hand-out of a donor's devices (policy.py): each receiver unit
where it shortens the step most, memoized within one decision so that its candidates
(more devices released each) cost about the largest release, not the sum; and the
moved requests' cost (`KvPrefix`, policy.moved_requests_s) over one donor's sorted KV.
The same keys and float operations as the plain unit-by-unit loop
(tests/test_scheduler_policy_equivalence.py keeps that loop as the reference)."""
from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynarl.core.scheduler.policy import ComponentView
    from dynarl.core.scheduler.predictor import Predictor


class Times:
    """One decision's memo of each component's remaining time at a device count
    (its remaining work over the predictor's rate there: a pure function of both, so
    equal to computing it again, bit for bit)."""

    __slots__ = ("predictor", "_memo", "_caps")

    def __init__(self, comps: tuple[ComponentView, ...], predictor: Predictor, caps: dict[str, int | None]) -> None:
        self.predictor = predictor
        self._memo: dict[str, dict[int, float]] = {c.name: {} for c in comps}
        self._caps = caps
        """Each component's engine cap for the predictor (policy.demand_engines)."""

    def of(self, c: ComponentView, devices: int) -> float:
        memo = self._memo[c.name]
        t = memo.get(devices)
        if t is None:
            rate = self.predictor.rate(c.name, devices, c.devices_per_engine, self._caps[c.name])
            t = memo[devices] = float("inf") if rate <= 0 else c.remaining_work / rate
        return t

    def memo(self, c: ComponentView) -> dict[int, float]:
        return self._memo[c.name]


class Greedy:
    """The donor's devices handed out one receiver unit at a time (the loop of the
    original _give_to_bottlenecks, same keys, same float operations): each unit goes to
    the receiver r minimizing (the step's predicted time if r got it, -r's remaining
    time, r's name). A pipelined stage's time enters the step's as max(worst, t) and a
    barrier stage's as a sum, in component order (predicted_time).

    The candidates of one decision (more devices released each) share this object:
    a unit's choice depends on the receivers' allocation and, only through the max,
    on the donor's time D. Where D is at most every fitting receiver's pipelined max
    (`bound`), the keys do not contain D, so the choice is the same for any such D.
    Those steps are recorded (`path`), and the next candidate replays them as long as
    its own D is within each step's bound and its pool still fits every receiver,
    then goes on unit by unit. So a decision costs about its largest release in
    units, not the sum of its candidates' releases."""

    __slots__ = ("times", "comps", "current", "donor", "receivers", "paths")

    def __init__(self, times: Times, comps: tuple[ComponentView, ...], current: dict[str, int],
                 donor: ComponentView, receivers: list[ComponentView]) -> None:
        self.times, self.comps, self.current, self.donor = times, comps, current, donor
        self.receivers = receivers
        self.paths: dict[tuple[str, ...], Path] = {}
        """Per eligible set (names): the steps free of D so far."""

    def give(self, release: int, eligible: list[ComponentView]
             ) -> tuple[dict[str, int], tuple[tuple[str, str, int], ...]]:
        comps, times, donor = self.comps, self.times, self.donor
        allocation = dict(self.current)
        allocation[donor.name] -= release
        pool = release
        counted = [c for c in comps if c.remaining_work > 0 and times.predictor.knows(c.name)]
        if len(eligible) == 1:  # no choice to make: every unit that fits goes to it
            r = eligible[0]
            n = pool // r.devices_per_engine * r.devices_per_engine
            allocation[r.name] += n
            allocation[donor.name] += pool - n
            return allocation, ((donor.name, r.name, n),) if n > 0 else ()
        donor_slot = next((k for k, c in enumerate(counted) if c is donor), -1)
        # D: the donor's time at its allocation, where predicted_time counts it
        d_time = times.of(donor, allocation[donor.name]) if donor_slot >= 0 else None
        path = self.paths.get(key := tuple(c.name for c in eligible))
        if path is None:
            path = self.paths[key] = Path()
        units = [r.devices_per_engine for r in eligible]
        widest = max(units)
        # replay the recorded steps while this candidate's pool fits every receiver and
        # its D is within every step's bound (the same choices, made in one jump)
        steps = len(path.chosen)
        step = min(bisect_right(path.used, release - widest, 0, steps),
                   steps if d_time is None else bisect_right(path.neg_bound, -d_time, 0, steps))
        chosen = path.chosen[:step]
        given = [chosen.count(j) * units[j] for j in range(len(eligible))]
        for j, r in enumerate(eligible):
            allocation[r.name] += given[j]
        pool -= path.used[step]
        grow = path.open and step == steps
        slots = [next(k for k, c in enumerate(counted) if c is r) for r in eligible]
        t_now = [times.of(c, allocation[c.name]) for c in counted]
        pipelined = [k for k, c in enumerate(counted) if not c.barrier]
        barrier = [k for k, c in enumerate(counted) if c.barrier]
        memos = [times.memo(r) for r in eligible]
        inf = float("inf")
        while True:
            best_key = None
            i, bound, t_best = -1, inf, 0.0
            for j, r in enumerate(eligible):
                u = units[j]
                if u > pool:
                    continue
                s = slots[j]
                a = allocation[r.name] + u
                t_new = memos[j].get(a)
                if t_new is None:
                    t_new = times.of(r, a)
                t_old, t_now[s] = t_now[s], t_new
                worst = others = 0.0  # others: the pipelined max without the donor's time
                for k in pipelined:
                    t = t_now[k]
                    if t > worst:
                        worst = t
                    if k != donor_slot and t > others:
                        others = t
                after = 0.0
                for k in barrier:
                    after += t_now[k]
                t_now[s] = t_old
                k_key = (worst + after, -t_old, r.name)
                if others < bound:
                    bound = others
                if best_key is None or k_key < best_key:
                    best_key, i, t_best = k_key, j, t_new
            if i < 0:
                break
            if grow:
                if pool >= widest and (d_time is None or d_time <= bound):
                    path.add(i, units[i], bound)
                else:
                    grow = path.open = False
            u = units[i]
            r = eligible[i]
            allocation[r.name] += u
            given[i] += u
            pool -= u
            t_now[slots[i]] = t_best
        allocation[donor.name] += pool  # units no receiver can use stay with the donor
        return allocation, tuple((donor.name, name, n) for name, n in
                                 sorted((r.name, n) for r, n in zip(eligible, given) if n > 0))


class Path:
    """A greedy's choices unit by unit from the receivers' current allocation, each
    valid for any donor time D up to its bound; kept as running sums, so a candidate
    replays a prefix in one step (bisect)."""

    __slots__ = ("chosen", "used", "neg_bound", "open")

    def __init__(self) -> None:
        self.chosen: list[int] = []
        """The receiver (its index among the eligible) that each step's unit went to."""
        self.used = [0]
        """Devices handed out by the first k steps."""
        self.neg_bound: list[float] = []
        """-(the lowest bound of the first k+1 steps): non-decreasing."""
        self.open = True
        """False once a step could not be recorded (it may not grow past it)."""

    def add(self, i: int, unit: int, bound: float) -> None:
        self.chosen.append(i)
        self.used.append(self.used[-1] + unit)
        self.neg_bound.append(max(self.neg_bound[-1], -bound) if self.neg_bound else -bound)


class KvPrefix:
    """moved_requests_s for several releases of one donor: its engines' KV sorted once
    (sums of ints: equal to summing a sorted slice each time)."""

    __slots__ = ("donor", "_prefix")

    def __init__(self, donor: ComponentView) -> None:
        self.donor = donor
        self._prefix: list[int] | None = None

    def moved_requests_s(self, release: int) -> float:
        donor = self.donor
        gone = release // donor.devices_per_engine
        kept = len(donor.engine_kv) - gone
        if donor.moved_token_s <= 0 or gone <= 0 or kept <= 0:
            return 0.0
        if self._prefix is None:
            self._prefix = [0]
            for kv in sorted(donor.engine_kv):
                self._prefix.append(self._prefix[-1] + kv)
        return self._prefix[gone] * donor.moved_token_s / kept
