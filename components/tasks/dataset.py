"""Real data: JSONL or Parquet files whose rows have a prompt and an answer.

Malformed rows (not JSON, not an object, a missing or non-text field, an empty
prompt, a prompt the tokenizer cannot encode or that is too long) are skipped
and counted, each with its row number and reason, and the load reports them; a
file with no usable row is an error. Row numbers are 1-based lines for JSONL and
0-based row indices for Parquet.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

from .problem import Problem

Check = Callable[[str], str | None]
"""Returns why a prompt is unusable (e.g. "character 'é' is not in the alphabet"), or None."""


@dataclass(kw_only=True, slots=True)
class DatasetConfig:
    path: str | None = None
    """A .jsonl or .parquet file; needed when task.kind is 'dataset'."""
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    """auto: from the file extension (.jsonl/.json -> jsonl, .parquet -> parquet)."""
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    template: str = "{prompt}"
    """How a row's prompt becomes the model's prompt; must contain {prompt}."""

    def __post_init__(self) -> None:
        if "{prompt}" not in self.template:
            raise ValueError("template must contain {prompt}")

    def resolved_format(self) -> str:
        if self.format != "auto":
            return self.format
        ext = os.path.splitext(self.path or "")[1].lower()
        if ext in (".jsonl", ".json", ".ndjson"):
            return "jsonl"
        if ext in (".parquet", ".pq"):
            return "parquet"
        raise ValueError(f"cannot tell the format of {self.path!r} from its extension; "
                         "set task.dataset.format to 'jsonl' or 'parquet'")


@dataclass(slots=True)
class Dataset:
    problems: list[Problem]
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """(row number, reason) of every malformed row."""

    def report(self, limit: int = 5) -> str:
        """One line for the user: how many rows were used and skipped, and why."""
        line = f"{len(self.problems)} rows loaded, {len(self.skipped)} skipped"
        if self.skipped:
            shown = "; ".join(f"row {n}: {why}" for n, why in self.skipped[:limit])
            more = f"; and {len(self.skipped) - limit} more" if len(self.skipped) > limit else ""
            line += f" ({shown}{more})"
        return line


def load_dataset(config: DatasetConfig, check: Check | None = None) -> Dataset:
    """Reads every row; raises FileNotFoundError / ValueError for an unusable file."""
    if not config.path:
        raise ValueError("task.dataset.path is required when task.kind is 'dataset'")
    if not os.path.isfile(config.path):
        raise FileNotFoundError(f"dataset file {config.path!r} does not exist")
    rows = _jsonl_rows(config.path) if config.resolved_format() == "jsonl" else _parquet_rows(config.path)
    dataset = Dataset([])
    for number, row in rows:
        problem, why = _problem(number, row, config, check)
        if problem is None:
            dataset.skipped.append((number, why))
        else:
            dataset.problems.append(problem)
    if not dataset.problems:
        raise ValueError(f"dataset {config.path!r} has no usable row: {dataset.report()}")
    return dataset


def _problem(number: int, row: Any, config: DatasetConfig, check: Check | None) -> tuple[Problem | None, str]:
    if isinstance(row, _Malformed):
        return None, row.reason
    if not isinstance(row, dict):
        return None, f"expected an object, got {type(row).__name__}"
    for name in (config.prompt_field, config.answer_field):
        if name not in row or row[name] is None:
            return None, f"missing field {name!r}"
    prompt, answer = row[config.prompt_field], row[config.answer_field]
    if not isinstance(prompt, str) or not prompt.strip():
        return None, f"field {config.prompt_field!r} must be non-empty text"
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        return None, f"field {config.answer_field!r} must be text or a number, got {type(answer).__name__}"
    text = config.template.format(prompt=prompt)
    why = check(text) if check is not None else None
    if why is not None:
        return None, why
    return Problem(f"r{number}", text, str(answer)), ""


class _Malformed:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _jsonl_rows(path: str) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, _Malformed(f"not valid JSON ({exc.msg})")


def _parquet_rows(path: str) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own types for a corrupt file
        raise ValueError(f"cannot read Parquet file {path!r}: {exc}") from None
    yield from enumerate(table.to_pylist())
