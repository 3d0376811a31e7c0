"""spans.jsonl: the run's spans of device use (stages.StageClock, what timeline.png is
drawn from), written as the run goes, so that what reads the run directory (the
dashboard, `dynarl dashboard RUN_DIR` on a running or finished run) sees who held which
device when, and the scheduler's moves ("migrate <kind>" spans).

One line per step, after its metrics row: {"step": N, "spans": [[component, devices,
start, end, label], ...]}, the spans added since the last line (step 0's also holds the
warm start's). Times are the controller loop's seconds. A step trained again (a restart
or `--resume` from an earlier checkpoint) writes its line again: the reader keeps the last.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from dynarl.components.workflows import jsonl
from dynarl.components.workflows.stages import Span

SPANS_FILE = "spans.jsonl"


class SpanLog:
    """Appends a clock's new spans to RUN_DIR/spans.jsonl, a line per step (no run
    directory, a simulation's: nothing)."""

    def __init__(self, run_dir: str | None) -> None:
        self.path = None if run_dir is None else os.path.join(run_dir, SPANS_FILE)
        self.written = 0
        """How many of the clock's spans are in the file."""

    def write(self, step: int, spans: Sequence[Span]) -> None:
        if self.path is not None:
            jsonl.append(self.path, {"step": step, "spans": [to_row(s) for s in spans[self.written:]]})
        self.written = len(spans)


def to_row(span: Span) -> list[Any]:
    return [span.component, list(span.devices), span.start, span.end, span.label]


def from_row(row: list[Any]) -> Span:
    component, devices, start, end, label = row
    return Span(str(component), [int(d) for d in devices], float(start), float(end), str(label))


def spans_of(records: Sequence[dict[str, Any]]) -> list[Span]:
    """The spans of spans.jsonl's `records`, a step written twice taken from its last
    line, in step order."""
    last: dict[int, dict[str, Any]] = {}
    for r in records:
        last[int(r["step"])] = r
    return [from_row(row) for step in sorted(last) for row in last[step]["spans"]]


def read(run_dir: str) -> list[Span]:
    """RUN_DIR/spans.jsonl's spans (none if it does not exist)."""
    return spans_of(jsonl.read(os.path.join(run_dir, SPANS_FILE)))
