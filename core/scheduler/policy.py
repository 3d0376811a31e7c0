"""Scheduling policies: pure functions of a ClusterView (each component's view at one
time, which the GlobalScheduler reads from the runtime hypergraph: loop.py, view.py;
the same in `dynarl train` and `dynarl sim`).

`static` never moves devices. `dynarl` (the paper's Algorithm 1):
1. A dynamic component is a donor when more than `theta` of its engines have
   stayed low (`engine_low`: below `u_low` utilization and past their peak, and
   taking no more prompts) for at least `window_s` seconds (`track_low`).
2. Candidates shrink the donor by 1..k engines (3-10 of them, spread evenly,
   never below its floor: `keep_engines`, by default the engines its active
   requests need) and hand the freed devices, one receiver unit at a time, to
   whichever receiver is then the bottleneck.
3. Each candidate's iteration time is predicted as the slowest stage's
   remaining work over its predicted rate (end-to-end throughput = the minimum
   stage throughput), plus the time of barrier stages (a trainer on the whole
   batch starts when the others are done, so its time adds to theirs); a
   component that gives or takes devices also pays its measured move cost
   (`move_cost_s`: its last round trip of migrations, out and back), and a
   donor the context its kept engines compute again for the requests moved to
   them (`moved_requests_s`: none where they take their KV along); with
   `charge_move_cost` false (the paper's rule) moves are free. The best
   is committed only if strictly faster than now, so a move that cannot pay
   for itself is not made.
4. Before the barrier, a barrier stage takes only the devices of engines that hold
   no request (`idle_engines`): a device given to it idles until the barrier, so
   feeding it must not slow the rollout, whose rate at fewer, fuller engines the
   predictor can underestimate. ppo-7b/16 lost 100 s of rollout when busy engines
   went to its trainer (its engines, far from full, looked low from the bulk phase
   on), and 15-33 s when they could go in the tail up to the busiest engine's load
   (their moved requests' long contexts computed again). At the barrier (every
   pipelined stage done with the step's work: `at_barrier`), the finished stages lend
   it their devices that it does not share already (`decide_barrier`, in its units),
   the rollout's last engine and inference's ranks included, until the step's end.
Only components at an interruptible point take part, and only those the predictor
has a rate for (a component not measured yet is neither timed nor given devices).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Mapping, Sequence

from dynarl.core.scheduler.greedy import Greedy, KvPrefix, Times
from dynarl.core.scheduler.predictor import Predictor


@dataclass(frozen=True, slots=True)
class ComponentView:
    name: str
    kind: Literal["dynamic", "static"]
    devices: int
    remaining_work: float
    """Work units this component still has to do in the iteration."""
    devices_per_engine: int = 1
    """Devices move in whole engines (rollout TP, trainer DP unit)."""
    min_devices: int = 1
    interruptible: bool = True
    active_requests: int | None = None
    """Dynamic components: requests still running (caps useful engines)."""
    requests_per_engine: int = 1
    """Requests one engine can batch: the engines those requests need is
    ceil(active_requests / requests_per_engine). 1: each request needs an engine."""
    keep_engines: int | None = None
    """A donor's floor in engines; None: the engines its active (running and waiting)
    requests need (demand_engines). Lower than demand lets the donor pack its requests denser,
    which the predictor prices through its rate at fewer engines."""
    move_cost_s: float = 0.0
    """Measured seconds this component's devices last took to move (out and back)."""
    barrier: bool = False
    """Starts only when the other stages have finished their remaining work (a trainer
    that steps on the whole batch): its time adds to theirs instead of overlapping."""
    engine_low_since: tuple[float | None, ...] = ()
    """Per engine: since when its utilization has stayed below u_low (None: not low)."""
    engine_kv: tuple[int, ...] = ()
    """A dynamic component's engines' active KV tokens (any order)."""
    moved_token_s: float = 0.0
    """Seconds an engine spends per token of context of a request moved to it (its
    prefill; with rollout.move_kv, the KV's transfer); 0: not known, not charged."""
    finished: bool = False
    """Its stage is over for the step: its devices idle until the step's end."""
    idle_engines: int = 0
    """A dynamic component's engines holding no request (releasing them moves none)."""
    lendable: int | None = None
    """Of its devices, those no barrier component holds too (what it can lend at the
    barrier; None: all of them)."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    now: float
    components: tuple[ComponentView, ...]


@dataclass(frozen=True, slots=True)
class DynarlConfig:
    theta: float = 0.8
    u_low: float = 0.2
    window_s: float = 4.0
    max_candidates: int = 8
    charge_move_cost: bool = True
    """Charge each moving component its measured move cost, and the donor the context
    its kept engines compute again (moved_requests_s); False: moves are free."""
    pack: float = 1.0
    """The donor's floor packs its active KV at this multiple of the step's mean peak
    fill (view.rollout_demand): above 1 the stragglers consolidate onto fewer engines."""
    donor: Literal["low", "packable"] = "low"
    """low: the paper's signal (track_low). packable: the rollout is a donor once its
    active KV, packed at `pack`, fits on at most (1 - theta) of its engines for
    window_s (view.packable_since): dynarl-consolidate."""

    def __post_init__(self) -> None:
        if not 0 <= self.theta < 1:
            raise ValueError(f"theta must be in [0, 1), got {self.theta}")
        if not 0 < self.u_low < 1:
            raise ValueError(f"u_low must be in (0, 1), got {self.u_low}")
        if self.window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {self.window_s}")
        if not 3 <= self.max_candidates <= 10:
            raise ValueError(f"max_candidates must be in [3, 10], got {self.max_candidates}")
        if self.pack <= 0:
            raise ValueError(f"pack must be > 0, got {self.pack}")
        if self.donor not in ("low", "packable"):
            raise ValueError(f"donor must be 'low' or 'packable', got {self.donor!r}")


@dataclass(frozen=True, slots=True)
class Plan:
    allocation: dict[str, int]
    """Devices per component after the move."""
    moves: tuple[tuple[str, str, int], ...]
    """(donor, receiver, devices)."""
    predicted_time_s: float
    """Predicted remaining time after the moves, their costs included."""
    current_time_s: float
    candidates: int
    migration_cost_s: float = 0.0
    """The measured move costs of the components the plan moves (summed)."""
    barrier: bool = False
    """The finished stages lend their devices (those no barrier stage shares, in its
    units) to the barrier stage until the step's end (their ranks stay, their memory
    freed): decide_barrier."""


def engine_low(utilization: float, peak: float, u_low: float, held: int = 0, held_peak: int = 0) -> bool:
    """The donor signal of one engine: its utilization (active KV / capacity) is below
    U_low and it is draining, not filling: below its own peak fill this cycle, or done
    with at least half the requests it held at its peak (none replaced them). At a
    step's start 256 requests x 200 prompt tokens use 2.5% of a 7B TP-2 engine: below
    any U_low, and its first short requests finish, but it is filling; while a small
    engine's tail can hold all the KV it ever held (its long requests still decode)
    yet be done with most of its requests. An engine that never held a request is low."""
    return peak == 0.0 or (utilization < u_low and (utilization < peak or 0 < held_peak and 2 * held <= held_peak))


def track_low(engines: Sequence[str], utilization: Sequence[float], now: float,
              since: Mapping[str, float | None], peak: Mapping[str, float], u_low: float,
              admitting: Sequence[bool] | None = None, held: Sequence[int] | None = None,
              held_peak: Mapping[str, int] | None = None,
              ) -> tuple[dict[str, float | None], dict[str, float], dict[str, int]]:
    """Pure: one poll of `engines` (their utilization and requests held, in order) ->
    per engine since when it has been low (None: not low), and the cycle's peaks of
    fill and of requests updated. Engines not polled drop out of `since` (released);
    their peaks stay (the cycle's fill). `admitting`: an engine that may still be
    handed prompts is never low."""
    peaks, held_peaks = dict(peak), dict(held_peak or {})
    out: dict[str, float | None] = {}
    for i, (key, u) in enumerate(zip(engines, utilization)):
        peaks[key] = max(peaks.get(key, 0.0), u)
        q = held[i] if held is not None else 0
        held_peaks[key] = max(held_peaks.get(key, 0), q)
        if admitting is not None and admitting[i]:
            out[key] = None
        elif engine_low(u, peaks[key], u_low, q, held_peaks[key]):
            out[key] = now if since.get(key) is None else since[key]
        else:
            out[key] = None
    return out, peaks, held_peaks


def is_donor(c: ComponentView, now: float, config: DynarlConfig) -> bool:
    if c.kind != "dynamic" or not c.interruptible or not c.engine_low_since:
        return False
    low = sum(1 for since in c.engine_low_since if since is not None and now - since >= config.window_s)
    return low > config.theta * len(c.engine_low_since)


def predicted_time(components: tuple[ComponentView, ...], allocation: dict[str, int], predictor: Predictor,
                   moving: frozenset[str] = frozenset(), delays: Mapping[str, float] | None = None) -> float:
    """Remaining iteration time: the slowest pipelined stage's remaining work over
    its rate, then the barrier stages' in turn; each component in `moving` delayed
    by its move cost, and each in `delays` by that many seconds."""
    worst = after = 0.0
    for c in components:
        if c.remaining_work <= 0 or not predictor.knows(c.name):
            continue
        rate = predictor.rate(c.name, allocation[c.name], c.devices_per_engine, demand_engines(c))
        cost = (c.move_cost_s if c.name in moving else 0.0) + (delays or {}).get(c.name, 0.0)
        t = float("inf") if rate <= 0 else cost + c.remaining_work / rate
        if c.barrier:
            after += t
        else:
            worst = max(worst, t)
    return worst + after


def at_barrier(components: tuple[ComponentView, ...], predictor: Predictor) -> bool:
    """Every pipelined stage is done with the step's work: a barrier stage may take
    devices now. Before, a device given to it would idle until then, while the stage
    that gave it up might still have used it."""
    return all(c.barrier or c.remaining_work <= 0 or not predictor.knows(c.name) for c in components)


def demand_engines(c: ComponentView) -> int | None:
    """Engines a dynamic component's running requests need (None: not capped)."""
    if c.kind != "dynamic" or c.active_requests is None:
        return None
    return -(-max(c.active_requests, 0) // max(c.requests_per_engine, 1))


def decide_dynarl(view: ClusterView, predictor: Predictor, config: DynarlConfig) -> Plan | None:
    comps = view.components
    current = {c.name: c.devices for c in comps}
    now_time = predicted_time(comps, current, predictor)
    if at_barrier(comps, predictor) and (plan := decide_barrier(view, predictor, config)) is not None:
        return plan
    best: Plan | None = None
    count = 0
    times = Times(comps, predictor, {c.name: demand_engines(c) for c in comps})  # one decision's memo: its candidates share the receivers' rates
    for donor in (c for c in comps if is_donor(c, view.now, config)):
        receivers = [c for c in comps if c.name != donor.name and c.interruptible and c.remaining_work > 0
                     and predictor.knows(c.name)]
        greedy = Greedy(times, comps, current, donor, receivers)
        kv = KvPrefix(donor)
        for release in _release_options(donor, config.max_candidates):
            eligible = receivers if release <= donor.idle_engines * donor.devices_per_engine else \
                [c for c in receivers if not c.barrier]
            if not eligible:
                continue
            allocation, moves = greedy.give(release, eligible)
            count += 1
            moving = frozenset({donor.name, *(r for _, r, _ in moves)} if config.charge_move_cost else ())
            delays = {donor.name: kv.moved_requests_s(release)} if config.charge_move_cost else None
            t = predicted_time(comps, allocation, predictor, moving, delays)
            if t < now_time and (best is None or t < best.predicted_time_s):
                best = Plan(allocation, moves, t, now_time, 0, sum(c.move_cost_s for c in comps if c.name in moving))
    return None if best is None else replace(best, candidates=count)


def decide_barrier(view: ClusterView, predictor: Predictor, config: DynarlConfig) -> Plan | None:
    """At the barrier (every pipelined stage done): the finished stages' devices, all of
    them (their ranks stay and free their memory; Workload migration keeps one engine),
    go to the barrier stage with the most time left, in its units, if that shortens the
    step (their move costs charged as in decide_dynarl)."""
    comps = view.components
    current = {c.name: c.devices for c in comps}
    receivers = [c for c in comps if c.barrier and c.interruptible and c.remaining_work > 0
                 and predictor.knows(c.name)]
    donors = [c for c in comps if c.finished and not c.barrier and _lendable(c) > 0]
    if not receivers or not donors:
        return None
    target = max(receivers, key=lambda c: (predicted_time((c,), current, predictor), c.name))
    unit = target.devices_per_engine
    pool = sum(_lendable(d) for d in donors) // unit * unit
    moves: list[tuple[str, str, int]] = []
    allocation = dict(current)
    for d in donors:  # the donors' devices in order, up to whole units of the target
        n = min(_lendable(d), pool)
        if n > 0:
            moves.append((d.name, target.name, n))
            allocation[d.name] -= n
            allocation[target.name] += n
            pool -= n
    if not moves:
        return None
    now_time = predicted_time(comps, current, predictor)
    moving = frozenset({target.name, *(name for name, _, _ in moves)} if config.charge_move_cost else ())
    t = predicted_time(comps, allocation, predictor, moving)
    if t >= now_time:
        return None
    return Plan(allocation, tuple(moves), t, now_time, 1, sum(c.move_cost_s for c in comps if c.name in moving),
                barrier=True)


def _lendable(c: ComponentView) -> int:
    return c.devices if c.lendable is None else min(c.lendable, c.devices)


def moved_requests_s(donor: ComponentView, release: int) -> float:
    """Pure: seconds the donor's kept engines spend on the context of the requests that
    giving up `release` devices moves to them: the emptiest engines go (as the mover's
    release_order picks them), and their active KV tokens are shared out over the
    engines kept, each at moved_token_s (0: not charged)."""
    return KvPrefix(donor).moved_requests_s(release)


def _release_options(donor: ComponentView, max_candidates: int) -> list[int]:
    """Devices the donor may give up: whole engines, keeping its floor (keep_engines, or
    the engines its active requests need) and its minimum; at most `max_candidates`
    options, evenly spread."""
    unit = donor.devices_per_engine
    engines = donor.devices // unit
    floor = demand_engines(donor) if donor.keep_engines is None else donor.keep_engines
    keep = max(donor.min_devices // unit + (donor.min_devices % unit > 0), 1, floor or 0)
    spare = engines - min(keep, engines)
    if spare <= 0:
        return []
    if spare <= max_candidates:
        steps = list(range(1, spare + 1))
    else:
        steps = sorted({max(1, round(spare * (i + 1) / max_candidates)) for i in range(max_candidates)})
    return [s * unit for s in steps]


def _give_to_bottlenecks(comps: tuple[ComponentView, ...], current: dict[str, int], donor: ComponentView,
                         release: int, receivers: list[ComponentView],
                         predictor: Predictor) -> tuple[dict[str, int], tuple[tuple[str, str, int], ...]]:
    """The donor's `release` devices, one receiver unit at a time, each where it shortens
    the step most (greedy.py Greedy.give); units no receiver can use stay with the donor."""
    times = Times(comps, predictor, {c.name: demand_engines(c) for c in comps})
    return Greedy(times, comps, current, donor, receivers).give(release, receivers)
