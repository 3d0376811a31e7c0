"""A run's segments: the processes that trained it (the first, then one per --resume).

Each appends to RUN_DIR/segments.jsonl when it starts ({"start": epoch s, "step": the
step it starts at}) and when it ends ({"end": epoch s}, also after Ctrl-C or a
failure). summary.json's wall_time_s is the sum of their wall times
(`wall_times`): each segment from its start to its end, or, for one that left no end
(kill -9, a lost host), to its last step line in metrics.jsonl (or the rolled-back
lines of a resume). Steps a run trained before it kept segments (no start record
before them) count as one more segment, from their first to their last line.
"""
from __future__ import annotations

import os
import time
from typing import Any

FILE = "segments.jsonl"


def begin(run_dir: str, step: int) -> None:
    from dynarl.components.workflows import jsonl
    jsonl.append(os.path.join(run_dir, FILE), {"start": time.time(), "step": step})


def end(run_dir: str) -> None:
    from dynarl.components.workflows import jsonl
    jsonl.append(os.path.join(run_dir, FILE), {"end": time.time()})


def wall_times(records: list[dict[str, Any]], line_times: list[float], now: float | None = None) -> list[float]:
    """Seconds of each segment, in order. `records`: segments.jsonl's; `line_times`:
    the "time" of every step line the run wrote (kept or rolled back); `now`: the last
    segment is this process's, still running (it ends now)."""
    spans: list[list[float | None]] = []
    for r in records:
        if "start" in r:
            spans.append([float(r["start"]), None])
        elif "end" in r and spans and spans[-1][1] is None:
            spans[-1][1] = float(r["end"])
    if now is not None and spans and spans[-1][1] is None:
        spans[-1][1] = now
    walls = []
    before = [t for t in line_times if spans and t < spans[0][0]] if spans else list(line_times)
    if before:  # steps trained before segments were kept
        walls.append(max(before) - min(before))
    for i, (start, stop) in enumerate(spans):
        if stop is None:  # no end record: to its last step line
            following = spans[i + 1][0] if i + 1 < len(spans) else float("inf")
            inside = [t for t in line_times if start <= t < following]
            stop = max(inside) if inside else start
        walls.append(max(0.0, stop - start))
    return walls


def run_wall_times(run_dir: str, now: float | None = None) -> list[float]:
    """wall_times of the run in `run_dir` (its files as they are now)."""
    from dynarl.components.workflows import jsonl
    lines = [r for name in ("metrics.jsonl", "metrics.rolled_back.jsonl")
             for r in jsonl.read(os.path.join(run_dir, name))]
    return wall_times(jsonl.read(os.path.join(run_dir, FILE)), [r["time"] for r in lines if "time" in r], now)
