"""reward.function run inside the project's Python sandbox (reward.sandbox).

The reward file's text is read once, in the reward worker (loading.py source_file,
check_source), and each chunk's samples go to the sandbox with it: one sandbox call
(components/tools/python_sandbox.py: bubblewrap, no network, the only writable folders
in memory, resource limits) per part of the chunk, up to reward.max_concurrency parts
at once (batched: one call, the whole chunk). The program each call runs is the
reward file's text, the samples as JSON text and sandbox_driver.py, which calls the
function on each sample under reward.timeout_s and writes a line per sample as it ends.

What the function can reach there: the standard library and the packages installed in
the interpreter's environment (read-only), not the files beside it, nor the network,
nor any file outside its in-memory /tmp and working folder; sandbox_memory_mb of
address space per process. A call that overruns is stopped inside (a timer); should
the whole sandbox overrun (the import time, then timeout_s per call, and a margin), it
is killed, and its samples without a result count as timeouts.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from dynarl.components.reward.config import RewardSection
from dynarl.components.reward.local import batch_outcomes
from dynarl.components.reward.loading import check_source, parse_spec, source_file
from dynarl.components.reward.outcome import Outcome, RewardInput, failed, judged, timeout_message
from dynarl.components.tools.config import ToolConfig
from dynarl.components.tools.python_sandbox import PythonSandbox

DRIVER = (Path(__file__).parent / "sandbox_driver.py").read_text()
MARKER = "\x1edynarl-reward "
MARGIN_S = 10.0
"""A sandbox call's time beyond its calls' own: the interpreter's start, the file's import."""
MAX_CALL_S = 3600.0
"""The sandbox's ceiling on one call (ToolConfig.timeout_s's largest value)."""


class SandboxReward:
    def __init__(self, section: RewardSection) -> None:
        spec = parse_spec(section.function)
        self.section, self.name = section, spec.name
        self.filename = source_file(spec)
        self.source = check_source(self.filename, spec.name)
        self.module = spec.target if not spec.is_file else Path(spec.target).stem
        self.sandbox = PythonSandbox(ToolConfig(
            timeout_s=MAX_CALL_S, cpu_s=int(MAX_CALL_S), memory_mb=section.sandbox_memory_mb,
            max_output_bytes=64 << 20, max_code_bytes=1 << 30, max_concurrency=section.max_concurrency))

    async def score(self, inputs: list[RewardInput]) -> list[Outcome]:
        """Every sample's outcome, in order. A sandbox that cannot isolate (no
        bubblewrap, no namespaces) raises SandboxUnavailable: no sample is scored bare."""
        await self.sandbox.check()
        if not inputs:
            return []
        parts = [inputs] if self.section.batched else split(inputs, self.section.max_concurrency)
        done = await asyncio.gather(*(self._run(part) for part in parts))
        return [outcome for part in done for outcome in part]

    def close(self) -> None:
        self.sandbox.close()

    async def _run(self, inputs: list[RewardInput]) -> list[Outcome]:
        s = self.section
        calls = 1 if s.batched else len(inputs)
        limit = min(MAX_CALL_S, MARGIN_S + calls * s.timeout_s)
        result = await self.sandbox.run(program(self.source, self.filename, self.module, self.name, s, inputs),
                                        timeout_s=limit)
        ended = f"the sandbox ended before scoring it ({result.error or 'no result'})"
        timed_out = result.error is not None and result.error.startswith("timeout")
        return outcomes(records_of(result.stdout), len(inputs), s, ended, timed_out)


def program(source: str, filename: str, module: str, name: str, section: RewardSection,
            inputs: list[RewardInput]) -> str:
    """The text one sandbox call runs: the driver's inputs as literals, then the driver."""
    payload = json.dumps([{"prompt": x.prompt, "response": x.response, "answer": x.answer,
                           "problem_id": x.problem_id, "sample_id": x.sample_id, "metadata": x.metadata}
                          for x in inputs])
    head = {"SOURCE": source, "FILENAME": filename, "MODULE": module, "NAME": name, "BATCHED": section.batched,
            "TIMEOUT_S": float(section.timeout_s), "PAYLOAD": payload}
    return "".join(f"{key} = {value!r}\n" for key, value in head.items()) + DRIVER


def records_of(stdout: str) -> list[dict[str, Any]]:
    """The driver's records in a sandbox call's output (a line that is not one, skipped)."""
    records = []
    for line in stdout.split("\n"):  # (not splitlines: it breaks at the marker's \x1e too)
        if line.startswith(MARKER):
            try:
                record = json.loads(line[len(MARKER):])
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def outcomes(records: list[dict[str, Any]], n: int, section: RewardSection, ended: str,
             timed_out: bool) -> list[Outcome]:
    """The driver's records as the `n` samples' outcomes. A load error, or a record for
    the whole call (i -1: batched), applies to every sample; a sample without a record
    failed with the sandbox (`ended`; a timeout when the sandbox was stopped for time)."""
    on_error = section.on_error
    by_index: dict[int, Outcome] = {}
    for record in records:
        if "load_error" in record:
            return [failed("error", record["load_error"], on_error)] * n
        outcome = _outcome(record, section)
        if record.get("i") == -1:
            if outcome is None:
                return batch_outcomes(record.get("value"), n, on_error)
            return [outcome] * n
        if isinstance(record.get("i"), int) and 0 <= record["i"] < n:
            by_index[record["i"]] = outcome if outcome is not None else judged(record.get("value"), on_error)
    missing = failed("timeout" if timed_out else "error", ended, on_error)
    return [by_index.get(i, missing) for i in range(n)]


def _outcome(record: dict[str, Any], section: RewardSection) -> Outcome | None:
    """A failed call's outcome; None for a returned value."""
    if record.get("timeout"):
        return failed("timeout", timeout_message(section.timeout_s), section.on_error)
    if "error" in record:
        return failed("error", str(record["error"]), section.on_error)
    return None


def split(items: list[Any], parts: int) -> list[list[Any]]:
    """`items` in at most `parts` contiguous parts of near-equal size, in order."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        out.append(items[start:end])
        start = end
    return out
