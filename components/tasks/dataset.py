"""Real data: JSONL or Parquet files, or folders written by `datasets`' save_to_disk,
whose rows have a prompt and an answer.

Malformed rows (longer than max_row_bytes, not UTF-8, not JSON or JSON the parser
cannot hold, not an object, a missing or non-text field, an empty prompt, a
reference answer the preset cannot find, a prompt the tokenizer cannot encode or
that is too long) are skipped and counted, each with its row number and reason,
and the load reports them; so is a row that raises anything else on its way to a
problem: no single row ends the load. A file with no usable row is an error. Row
numbers are 1-based lines for JSONL and 0-based row indices for Parquet and saved
folders; rows.py reads them, within max_row_bytes.

Presets (`preset`) set in one word what a known format needs, for every field left
at its default: the fields, the prompt template and how the reference answer is
taken from the answer field (PRESETS).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from dynarl.components.tasks.problem import Problem
from dynarl.components.tasks.rows import Malformed, jsonl_rows, parquet_rows, saved_rows

Check = Callable[[str], str | None]
"""Returns why a prompt is unusable (e.g. "character 'é' is not in the alphabet"), or None."""
Chat = Callable[[str], str]
"""A prompt as the model's chat template formats it (the tokenizer's `chat`)."""


Extract = Literal["none", "gsm8k", "boxed"]


@dataclass(frozen=True, slots=True)
class Preset:
    prompt_field: str
    answer_field: str
    template: str
    extract: Extract


PRESETS = {
    "plain": Preset("prompt", "answer", "{prompt}", "none"),
    # GSM8K: `question`, and `answer` a rationale ending in `#### 42` (the reference: 42)
    "gsm8k": Preset("question", "answer",
                    "{prompt}\nThink step by step, then give the final answer after \"####\".", "gsm8k"),
    # MATH (Hendrycks et al.): `problem`, and `solution` whose last \boxed{...} is the reference
    "math": Preset("problem", "solution",
                   "{prompt}\nThink step by step, then put the final answer in \\boxed{{}}.", "boxed"),
}
DEFAULTS = PRESETS["plain"]


@dataclass(kw_only=True, slots=True)
class DatasetConfig:
    path: str | None = None
    """A .jsonl or .parquet file, or a `datasets` save_to_disk folder; needed when task.kind is 'dataset'."""
    format: Literal["auto", "jsonl", "parquet", "saved"] = "auto"
    """auto: a folder -> saved (save_to_disk's Arrow files), else from the file extension
    (.jsonl/.json -> jsonl, .parquet -> parquet)."""
    split: str = "train"
    """The split to read from a saved DatasetDict folder (one with dataset_dict.json)."""
    eval_path: str | None = None
    """Held-out rows (a file or folder as `path`, the same fields) that `dynarl eval` reads
    by default; training never reads them."""
    eval_split: str = "test"
    """`dynarl eval`'s held-out split of a saved DatasetDict folder: eval_path's, or, without
    eval_path, path's when it has this split (training reads `split`)."""
    preset: Literal["plain", "gsm8k", "math"] | None = None
    """Fields, template and answer extraction of a known format (PRESETS), for the ones left at their defaults."""
    prompt_field: str = DEFAULTS.prompt_field
    answer_field: str = DEFAULTS.answer_field
    template: str = DEFAULTS.template
    """How a row's prompt becomes the model's prompt; must contain {prompt}."""
    chat: bool = False
    """Format each prompt (after `template`) with the model's chat template, as the user's
    message with the assistant's turn opened (needs model.path with a chat_template)."""
    extract: Extract | None = None
    """How the reference answer is taken from the answer field: none (as it is), gsm8k
    (after the last '####', commas dropped), boxed (the last \\boxed{...}); default: the preset's, else none."""
    max_row_bytes: int = 16 << 20
    """A longer row is skipped unread and counted: a JSONL line (read in bounded pieces,
    never held whole), or a Parquet/saved row's text columns together. Bounds the
    memory one row costs while loading."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_row_bytes, int) or isinstance(self.max_row_bytes, bool) \
                or self.max_row_bytes < 1:
            raise ValueError(f"max_row_bytes must be an integer >= 1, got {self.max_row_bytes!r}")
        preset = PRESETS[self.preset] if self.preset is not None else DEFAULTS
        for name in ("prompt_field", "answer_field", "template"):
            if getattr(self, name) == getattr(DEFAULTS, name):
                setattr(self, name, getattr(preset, name))
        if self.extract is None:
            self.extract = preset.extract
        if "{prompt}" not in self.template:
            raise ValueError("template must contain {prompt}")

    def resolved_format(self) -> str:
        if self.format != "auto":
            return self.format
        if self.path and os.path.isdir(self.path):
            return "saved"
        ext = os.path.splitext(self.path or "")[1].lower()
        if ext in (".jsonl", ".json", ".ndjson"):
            return "jsonl"
        if ext in (".parquet", ".pq"):
            return "parquet"
        raise ValueError(f"cannot tell the format of {self.path!r} from its extension; "
                         "set task.dataset.format to 'jsonl', 'parquet' or 'saved'")


MAX_REASON = 300
"""Characters of a skip reason kept (one naming a row's fields could be as long as the row)."""


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


def load_dataset(config: DatasetConfig, check: Check | None = None, chat: Chat | None = None) -> Dataset:
    """Reads every row; raises FileNotFoundError / ValueError for an unusable file."""
    if not config.path:
        raise ValueError("task.dataset.path is required when task.kind is 'dataset'")
    if config.chat and chat is None:
        raise ValueError("chat: the model's tokenizer has no chat template (model.path's tokenizer_config.json "
                         "chat_template or chat_template.jinja); the built-in model has none")
    if not os.path.exists(config.path):
        raise FileNotFoundError(f"dataset file {config.path!r} does not exist")
    kind, cap = config.resolved_format(), config.max_row_bytes
    rows = (jsonl_rows(config.path, cap) if kind == "jsonl" else parquet_rows(config.path, cap)
            if kind == "parquet" else saved_rows(config.path, config.split, cap))
    dataset = Dataset([])
    for number, row in rows:
        try:
            problem, why = _problem(number, row, config, check, chat if config.chat else None)
        except Exception as exc:  # whatever one row raises (a template, a tokenizer) skips that row only
            problem, why = None, f"{type(exc).__name__}: {exc}"
        if problem is None:
            dataset.skipped.append((number, why if len(why) <= MAX_REASON else why[:MAX_REASON - 3] + "..."))
        else:
            dataset.problems.append(problem)
    if not dataset.problems:
        raise ValueError(f"dataset {config.path!r} has no usable row: {dataset.report()}")
    return dataset


def _problem(number: int, row: Any, config: DatasetConfig, check: Check | None,
             chat: Chat | None) -> tuple[Problem | None, str]:
    if isinstance(row, Malformed):
        return None, row.reason
    if not isinstance(row, dict):
        return None, f"expected an object, got {type(row).__name__}"
    for name in (config.prompt_field, config.answer_field):
        if name not in row:
            return None, missing_field(name, row)
        if row[name] is None:
            return None, f"field {name!r} is null"
    prompt, answer = row[config.prompt_field], row[config.answer_field]
    if not isinstance(prompt, str) or not prompt.strip():
        return None, f"field {config.prompt_field!r} must be non-empty text"
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        return None, f"field {config.answer_field!r} must be text or a number, got {type(answer).__name__}"
    answer = reference_answer(str(answer), config.extract)
    if answer is None:
        return None, f"unparsable answer: no {EXTRACT_WHAT[config.extract]} in field {config.answer_field!r}"
    text = config.template.format(prompt=prompt)
    if chat is not None:
        text = chat(text)
    why = check(text) if check is not None else None
    if why is not None:
        return None, why
    return Problem(f"r{number}", text, str(answer), row_metadata(row, config)), ""


def row_metadata(row: dict, config: DatasetConfig) -> dict | None:
    """The row's fields other than its prompt and answer, for a reward function
    (reward.function's `metadata`); a field JSON cannot hold (bytes, a date) left out.
    None when none is left."""
    kept = {}
    for name, value in row.items():
        if name in (config.prompt_field, config.answer_field):
            continue
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            continue
        kept[str(name)] = value
    return kept or None


EXTRACT_WHAT = {"gsm8k": "'#### <answer>'", "boxed": "\\boxed{...}"}


def reference_answer(text: str, extract: Extract) -> str | None:
    """The reference answer in an answer field, or None when it is not there."""
    if extract == "none":
        return text
    if extract == "gsm8k":
        if "####" not in text:
            return None
        answer = text.rsplit("####", 1)[1].strip().replace(",", "")
        return answer or None
    return last_boxed(text)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (braces inside it balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j].strip() or None
    return None


def missing_field(name: str, row: dict) -> str:
    """Why a row lacks `name`: the fields it has, and a preset that reads them."""
    fits = [p for p, preset in PRESETS.items() if preset.prompt_field in row and preset.answer_field in row]
    hint = f"; task.dataset.preset={fits[0]} reads these rows" if fits else ""
    return f"missing field {name!r} (the row has: {', '.join(map(str, row)) or 'no field'}{hint})"
