"""The pure parts of `dynarl bench peers`: a process tree's memory from /proc samples,
the medians, the per-pair ratios and the reward curve's halves."""
from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Proc:
    ppid: int
    rss: int
    """bytes resident"""
    pss: int | None = None
    """bytes proportional (shared pages split among their processes); None: not readable"""


def descendants(root: int, table: dict[int, Proc]) -> set[int]:
    """`root` and every process below it in `table` (pid -> Proc)."""
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in found or pid not in table:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def tree_memory(root: int, table: dict[int, Proc]) -> tuple[int, int]:
    """(RSS, PSS) summed over the tree under `root`; a process without PSS counts its RSS."""
    pids = descendants(root, table)
    rss = sum(table[p].rss for p in pids)
    pss = sum(table[p].pss if table[p].pss is not None else table[p].rss for p in pids)
    return rss, pss


def read_proc_table() -> dict[int, Proc]:
    """Every readable process of this machine (/proc/PID/stat, statm, smaps_rollup)."""
    page = os.sysconf("SC_PAGE_SIZE")
    table: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/statm") as f:
                rss = int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        table[int(name)] = Proc(ppid, rss)
    return table


def _pss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reads_pss(rss: int, peak_rss: int, since_pss: float, pss_period: float) -> bool:
    """Whether a sample also reads PSS: at a new RSS peak, or near it (within 10%) once
    `pss_period` s have passed since the last read. A heuristic: on these trees the
    shared pages (the libraries) hold steady, so the PSS peak comes with the RSS peak."""
    return rss > peak_rss or (rss >= 0.9 * peak_rss and since_pss >= pss_period)


@dataclass
class TreeSampler:
    """Samples the tree under `root` every `period` s on a thread; keeps the peaks. RSS
    (statm) every sample; PSS (smaps_rollup: ~1.3 ms a torch process, 10 ms a sample
    of dynarl's 8, a tenth of a core at 0.1 s, and 4x what TRL's one process costs)
    at a new RSS peak, or within 10% of it every `pss_period` s."""
    root: int
    period: float = 0.1
    pss_period: float = 0.5
    peak_rss: int = 0
    peak_pss: int = 0
    samples: int = 0
    pss_samples: int = 0
    _last_pss: float = float("-inf")
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        table = read_proc_table()
        pids = descendants(self.root, table)
        rss, _ = tree_memory(self.root, table)
        if reads_pss(rss, self.peak_rss, now - self._last_pss, self.pss_period):
            table = {p: (Proc(t.ppid, t.rss, _pss(p)) if p in pids else t) for p, t in table.items()}
            self.peak_pss = max(self.peak_pss, tree_memory(self.root, table)[1])
            self._last_pss = now
            self.pss_samples += 1
        self.peak_rss = max(self.peak_rss, rss)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period)

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def median_after_warmup(times: list[float], warmup: int) -> float:
    """The median of `times` less its first `warmup` (all of them when too few remain)."""
    if not times:
        raise ValueError("no step times")
    kept = times[warmup:] or times
    return statistics.median(kept)


def halves(values: list[float]) -> tuple[float, float]:
    """Mean of the first half and of the last half (the middle one of an odd count in both)."""
    if not values:
        raise ValueError("no values")
    n = len(values)
    first, last = values[:(n + 1) // 2], values[n // 2:]
    return statistics.fmean(first), statistics.fmean(last)


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run of one side: per-step figures and the tree's peaks."""
    side: str
    step_s: list[float]
    reward: list[float]
    mean_length: list[float]
    max_length: list[float]
    peak_rss: int
    peak_pss: int
    wall_s: float

    def summary(self, warmup: int) -> dict:
        first, last = halves(self.reward)
        return {"side": self.side, "steps": len(self.step_s), "median_step_s": median_after_warmup(self.step_s, warmup),
                "step_s": self.step_s, "peak_rss_bytes": self.peak_rss, "peak_pss_bytes": self.peak_pss,
                "mean_length": statistics.fmean(self.mean_length), "max_length": max(self.max_length),
                "reward_first_half": first, "reward_last_half": last, "wall_s": self.wall_s}


def pair_ratios(dynarl: dict, peer: dict) -> dict:
    """dynarl over the peer: median step time, peak RSS and peak PSS (below 1: dynarl less)."""
    return {"step_time": dynarl["median_step_s"] / peer["median_step_s"],
            "peak_rss": dynarl["peak_rss_bytes"] / peer["peak_rss_bytes"],
            "peak_pss": dynarl["peak_pss_bytes"] / peer["peak_pss_bytes"]}
