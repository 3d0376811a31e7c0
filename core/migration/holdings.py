"""Who holds which device: one value (`Holdings`), and the Mover's plans as pure
functions of it (mover.py carries them out). Table-tested in tests/test_holdings.py."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence


@dataclass(frozen=True, slots=True)
class MoveCosts:
    """Seconds a move costs on the devices beyond the calls it makes."""
    release_s: float = 0.0
    """Released engines pause and offload before their devices are free."""
    switch_s: float = 0.0
    """A role switch: one role offloads, another onloads."""
    restart_s: float = 0.0
    """A role switch that restarts an engine (at another TP)."""
    state_s: float = 0.0
    """A stateful component's (the trainer's) state over one device link."""


@dataclass(frozen=True, slots=True)
class Holdings:
    """The devices each component holds now, and who holds another's: replaced, never
    changed, at each change of ownership."""
    counts: Mapping[str, int]
    """Devices each component holds (lent and in-flight devices counted right)."""
    lent: tuple[int, ...] = ()
    """First device of each rollout engine running on the parked components' home devices."""
    parked: tuple[str, ...] = ()
    """Components whose devices the rollout holds (their stages wait)."""
    credit: Mapping[str, int] = field(default_factory=dict)
    """Home devices returned to a component and not yet counted against a move to it."""
    wide: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """First device of each wide rollout engine -> every device it runs on."""
    barrier_lent: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Finished component -> its devices the barrier stage holds until the step's end."""

    def change(self, **delta: int) -> "Holdings":
        counts = dict(self.counts)
        for name, d in delta.items():
            counts[name] += d
        return replace(self, counts=counts)

    def spend_credit(self, name: str) -> tuple[int, "Holdings"]:
        """The component's credit, and the holdings without it."""
        return self.credit.get(name, 0), replace(self, credit={k: v for k, v in self.credit.items() if k != name})

    def lend_to_barrier(self, name: str, devices: Sequence[int]) -> "Holdings":
        """The component's `devices` go to the barrier stage until the step's end."""
        return replace(self, barrier_lent={**self.barrier_lent, name: (*self.barrier_lent.get(name, ()), *devices)})

    def without_wide(self, firsts: Sequence[int]) -> "Holdings":
        """The wide engines with these first devices are gone."""
        return replace(self, wide={f: ds for f, ds in self.wide.items() if f not in firsts})

    def engine_devices(self, first: int, tp: int) -> list[int]:
        """The devices of the donor engine whose first device is `first`."""
        return list(self.wide.get(first) or [first + k for k in range(tp)])


def release_order(active: Sequence[bool], utilization: Sequence[float], width: Sequence[int],
                  devices: int) -> list[int]:
    """The donor engines to release for at most `devices` devices: finished engines
    first, then the emptiest; never all of them, nor the last engine whose generation
    still runs (its requests would have nowhere to go)."""
    order = sorted(range(len(active)), key=lambda p: (active[p], utilization[p], p))
    running = sum(active)
    release: list[int] = []
    taken = 0
    for p in order:
        if len(release) >= len(active) - 1:
            break
        if taken + width[p] > devices:
            continue
        if active[p]:
            if running == 1:
                break
            running -= 1
        release.append(p)
        taken += width[p]
    return release


def lend_firsts(home: Sequence[int], tp: int) -> list[int]:
    """First devices of the rollout engines that fit on the parked components' home
    devices (`home`, sorted): TP-wide runs of consecutive devices."""
    return [home[i] for i in range(0, len(home) - tp + 1, tp) if home[i + tp - 1] - home[i] == tp - 1]


def barrier_shares(freed: Sequence[int], held: Mapping[str, Sequence[int]], own: set[int],
                   wanted: Mapping[str, int], unit: int) -> tuple[list[int], dict[str, list[int]]]:
    """What a barrier plan gives its target: of the donors' engines that left, their
    devices (`freed`), and per donor the devices it lends in place (`held`: its ranks'
    devices, less the target's own `own`, at most `wanted`), trimmed to whole `unit`s
    (lent devices last donor first, then freed ones). Returns (freed devices given,
    devices each donor lends)."""
    lent = {donor: [d for d in held[donor] if d not in own][:n] for donor, n in wanted.items() if n > 0}
    extra = (len(freed) + sum(map(len, lent.values()))) % unit
    for donor in reversed(list(lent)):
        cut = min(extra, len(lent[donor]))
        lent[donor], extra = lent[donor][:len(lent[donor]) - cut], extra - cut
    return list(freed[:len(freed) - extra]), {donor: ds for donor, ds in lent.items() if ds}


@dataclass(frozen=True, slots=True)
class Restore:
    """The moves back to the configured placement at a step's end, in this order."""
    reshard: tuple[str, ...]
    """P2P components not on their home devices: they reshard home."""
    reclaim: Mapping[str, tuple[int, ...]]
    """Ranks that lent their devices to the barrier take their memory back."""
    park: Mapping[str, tuple[int, ...]]
    """Positions of each joining receiver's extra ranks, parked."""
    park_lent: tuple[int, ...]
    """First devices of the lent rollout engines (still running: parked)."""
    rejoin: tuple[int, ...]
    """First devices of the rollout's home engines no engine holds (after parking the lent ones)."""
    restart: tuple[int, ...]
    """First devices of the wide engines: stopped and started again at the base TP."""

    @property
    def nothing_else(self) -> bool:
        """Beyond resharding and reclaiming, nothing moves."""
        return not any(self.park.values()) and not self.restart and not self.park_lent and not self.rejoin


def restore_plan(h: Holdings, home: Mapping[str, Sequence[int]], p2p_at: Mapping[str, Sequence[int]],
                 extra: Mapping[str, Sequence[int]], rollout_firsts: Sequence[int], donor: str,
                 tp: int) -> Restore:
    """Back home: `p2p_at` the devices each resharding component holds now, `extra` each
    joining receiver's ranks beyond its configured ones, `rollout_firsts` the first
    devices of the rollout's engines now."""
    reshard = tuple(name for name, devices in p2p_at.items() if sorted(devices) != list(home[name]))
    held = {f for f in rollout_firsts if f not in h.lent and f not in h.wide}
    rejoin = tuple(d for d in list(home[donor])[::tp] if d not in held and d not in h.wide)
    return Restore(reshard, dict(h.barrier_lent), {n: tuple(p) for n, p in extra.items()},
                   h.lent, rejoin, tuple(sorted(h.wide)))
