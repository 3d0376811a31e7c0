"""Read a batch from a JSONL trace instead of a generator (`dynarl sim --trace FILE`).

One JSON object per line, one request each:
    {"prompt_id": "p1", "response_tokens": 812}                        single-turn
    {"prompt_id": "p1", "turns": [{"gen_tokens": 300, "tool_latency_s": 0.2,
                                   "obs_tokens": 120}, ...]}            multi-turn
optionally with "prompt_tokens": int (else drawn from the workload's prompt lengths,
seeded by the prompt id). Requests with one prompt_id form a group, in order of
first appearance. A malformed line (bad JSON, a missing or mistyped field, a
negative count, the other kind of request than the workload's) is rejected and
reported with its line number; the rest are used. Blank lines are skipped.
"""
from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from dynarl.components.workloads.generate import draw
from dynarl.components.workloads.samples import Group, SampleSpec, Turn
from dynarl.components.workloads.spec import Workload


@dataclass(slots=True)
class Trace:
    groups: list[Group]
    rejected: list[tuple[int, str]] = field(default_factory=list)
    """(line number, reason) of every rejected line."""

    @property
    def num_requests(self) -> int:
        return sum(len(g.samples) for g in self.groups)


class TraceError(ValueError):
    """The trace has no usable request."""


def load_trace(path: str, workload: Workload) -> Trace:
    with open(path) as f:
        return parse_trace(f, workload)


def parse_trace(lines: Iterable[str], workload: Workload) -> Trace:
    multi = workload.kind == "agentic"
    order: list[str] = []
    samples: dict[str, list[SampleSpec]] = {}
    prompt_lens: dict[str, int] = {}
    rejected: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            pid, sample, plen = _parse_line(line, multi)
        except ValueError as exc:
            rejected.append((number, str(exc)))
            continue
        if pid not in samples:
            order.append(pid)
            samples[pid] = []
        if plen is not None:
            prompt_lens.setdefault(pid, plen)
        samples[pid].append(SampleSpec(f"{pid}/{len(samples[pid])}", *sample))
    if not order:
        raise TraceError(f"no usable request in the trace ({len(rejected)} rejected line(s)"
                         + (f", first: line {rejected[0][0]}: {rejected[0][1]})" if rejected else ")"))
    groups = [Group(pid, prompt_lens.get(pid) or _prompt_len(workload, pid), tuple(samples[pid])) for pid in order]
    return Trace(groups, rejected)


def _parse_line(line: str, multi: bool) -> tuple[str, tuple, int | None]:
    """(prompt id, SampleSpec's fields after its id, prompt tokens or None)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    pid = obj.get("prompt_id")
    if not isinstance(pid, str) or not pid:
        raise ValueError("prompt_id must be a non-empty string")
    plen = obj.get("prompt_tokens")
    if plen is not None:
        plen = _count(plen, "prompt_tokens", minimum=1)
    if multi:
        if "turns" not in obj:
            raise ValueError("a multi-turn workload needs 'turns'")
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError("turns must be a non-empty list")
        return pid, (0, tuple(_turn(t, i) for i, t in enumerate(turns))), plen
    if "response_tokens" not in obj:
        raise ValueError("a single-turn workload needs 'response_tokens'")
    return pid, (_count(obj["response_tokens"], "response_tokens", minimum=1),), plen


def _turn(t: Any, i: int) -> Turn:
    if not isinstance(t, dict):
        raise ValueError(f"turns[{i}] is not an object")
    latency = t.get("tool_latency_s")
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not math.isfinite(latency) or latency < 0:
        raise ValueError(f"turns[{i}].tool_latency_s must be a finite number >= 0")
    return Turn(_count(t.get("gen_tokens"), f"turns[{i}].gen_tokens", minimum=1), float(latency),
                _count(t.get("obs_tokens"), f"turns[{i}].obs_tokens", minimum=0))


def _count(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _prompt_len(workload: Workload, pid: str) -> int:
    rng = np.random.Generator(np.random.PCG64(zlib.crc32(pid.encode())))
    return int(draw(rng, workload.prompt_tokens, 1)[0])


def batch_of(trace: Trace, iteration: int, prompts: int) -> list[Group]:
    """Iteration i's groups: the next `prompts` groups of the trace, wrapping around;
    a trace with fewer groups than that gives all of them every iteration."""
    groups = trace.groups
    if len(groups) <= prompts:
        return list(groups)
    start = (iteration * prompts) % len(groups)
    return [groups[(start + i) % len(groups)] for i in range(prompts)]
