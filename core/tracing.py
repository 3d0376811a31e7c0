"""Chrome-trace / Perfetto JSON of calls, lock waits and group lifecycle.

Times come from the running loop (virtual time in simulations), in microseconds.
"""
from __future__ import annotations

import json
import os
from typing import Any

from dynarl.core.files import atomic_open


class Tracer:
    def __init__(self, enabled: bool = True, max_events: int = 2_000_000) -> None:
        self.enabled = enabled
        self.max_events = max_events
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self._track_ids: dict[str, int] = {}

    def complete(self, name: str, cat: str, track: str, lane: int, start_s: float, end_s: float,
                 args: dict[str, Any] | None = None) -> None:
        """A span on `track` (one per group or subsystem), `lane` (the rank)."""
        if not self.enabled:
            return
        self._add({"name": name, "cat": cat, "ph": "X", "pid": self._pid(track), "tid": lane,
                   "ts": start_s * 1e6, "dur": max(0.0, end_s - start_s) * 1e6, "args": args or {}})

    def instant(self, name: str, cat: str, track: str, at_s: float, args: dict[str, Any] | None = None) -> None:
        if not self.enabled:
            return
        self._add({"name": name, "cat": cat, "ph": "i", "s": "p", "pid": self._pid(track), "tid": 0,
                   "ts": at_s * 1e6, "args": args or {}})

    def write(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": track}}
                for track, pid in self._track_ids.items()]
        with atomic_open(path) as f:  # a full disk leaves no half trace
            json.dump({"traceEvents": meta + self.events, "displayTimeUnit": "ms",
                       "otherData": {"dropped_events": self.dropped}}, f)

    def _pid(self, track: str) -> int:
        pid = self._track_ids.get(track)
        if pid is None:
            pid = self._track_ids[track] = len(self._track_ids) + 1
        return pid

    def _add(self, event: dict[str, Any]) -> None:
        if len(self.events) >= self.max_events:
            self.dropped += 1  # bounded memory on very long runs
            return
        self.events.append(event)
