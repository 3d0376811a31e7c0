"""A dataset file's rows, read so that no single row can end the load or its memory.

Each reader yields (row number, row), or (row number, Malformed(reason)) for a row
it could not read:

- JSONL: a line longer than `max_row_bytes` is skipped without ever being held whole
  (read in bounded pieces up to its end); a line that is not UTF-8, not JSON, nested
  too deeply for the parser (RecursionError) or holding a number of more digits than
  int() converts (ValueError) is named, not raised.
- Parquet and `datasets` save_to_disk folders (Arrow): a row whose text columns
  together exceed `max_row_bytes` is skipped before it becomes Python objects, and a
  row whose values do not convert is skipped alone. The file itself is read whole
  into Arrow memory, so there a huge row costs its size once.

Row numbers are 1-based lines for JSONL and 0-based row indices for Arrow.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Iterator

SKIP_PIECE = 1 << 20
"""Bytes read at a time while passing over the rest of an over-long line."""
ARROW_BATCH = 1024
"""Arrow rows converted to Python at a time."""


class Malformed:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def jsonl_rows(path: str, max_row_bytes: int) -> Iterator[tuple[int, Any]]:
    with open(path, "rb") as f:
        number = 0
        # the limit keeps one read to max_row_bytes (+1, to tell a line of exactly that size)
        while raw := f.readline(max_row_bytes + 1):
            number += 1
            if len(raw) - raw.endswith(b"\n") > max_row_bytes:  # so its newline is not read yet
                size = len(raw) + _skip_line(f)
                yield number, Malformed(f"line of {size} bytes, more than task.dataset.max_row_bytes "
                                        f"({max_row_bytes}); not read")
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, Malformed(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")
                continue
            if line.strip():
                yield number, parse_json(line)


def _skip_line(f: Any) -> int:
    """Reads past the rest of the current line in bounded pieces; its bytes, less the newline."""
    skipped = 0
    while piece := f.readline(SKIP_PIECE):
        if piece.endswith(b"\n"):
            return skipped + len(piece) - 1
        skipped += len(piece)
    return skipped


def parse_json(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        return Malformed(f"not valid JSON ({exc.msg})")
    except RecursionError:
        return Malformed("JSON nested too deeply to read")
    except ValueError as exc:  # a number of more digits than int() converts (sys.get_int_max_str_digits)
        return Malformed(f"JSON not readable ({str(exc).split(':')[0]})")


def parquet_rows(path: str, max_row_bytes: int) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own types for a corrupt file
        raise ValueError(f"cannot read Parquet file {path!r}: {exc}") from None
    yield from arrow_rows(table.to_batches(ARROW_BATCH), max_row_bytes)


def saved_rows(path: str, split: str, max_row_bytes: int) -> Iterator[tuple[int, Any]]:
    """The rows of a `datasets` save_to_disk folder: state.json lists its Arrow files
    (Arrow IPC streams); a DatasetDict folder has one such folder per split."""
    splits_file = os.path.join(path, "dataset_dict.json")
    if os.path.isfile(splits_file):
        with open(splits_file) as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            raise ValueError(f"{path!r} has the splits {', '.join(splits)}, not {split!r}: set task.dataset.split")
        path = os.path.join(path, split)
    try:
        with open(os.path.join(path, "state.json")) as f:
            files = [entry["filename"] for entry in json.load(f)["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path!r} is not a datasets save_to_disk folder (state.json: {exc})") from None
    yield from arrow_rows(_saved_batches(path, files), max_row_bytes)


def _saved_batches(path: str, files: list[str]) -> Iterator[Any]:
    import pyarrow as pa
    for name in files:
        try:
            with pa.memory_map(os.path.join(path, name)) as source:
                table = pa.ipc.open_stream(source).read_all()
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"cannot read {name} of {path!r}: {exc}") from None
        yield from table.to_batches(ARROW_BATCH)


def arrow_rows(batches: Iterable[Any], max_row_bytes: int) -> Iterator[tuple[int, Any]]:
    number = 0
    for batch in batches:
        sizes = text_bytes(batch)
        fits = [i for i, size in enumerate(sizes) if size <= max_row_bytes]
        converted = dict(zip(fits, _to_python(batch, fits)))
        for i, size in enumerate(sizes):
            row = converted[i] if i in converted else Malformed(
                f"text of {size} bytes, more than task.dataset.max_row_bytes ({max_row_bytes}); not read")
            yield number + i, row
        number += batch.num_rows


def text_bytes(batch: Any) -> list[int]:
    """Each row's bytes in the batch's string and binary columns (nested values not counted)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    total = pa.array([0] * batch.num_rows, pa.int64())
    for column in batch.columns:
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
                or pa.types.is_large_binary(kind):
            lengths = pc.cast(pc.fill_null(pc.binary_length(column), 0), pa.int64())
            total = pc.add(total, lengths)
    return total.to_pylist()


def _to_python(batch: Any, rows: list[int]) -> list[Any]:
    try:
        return batch.take(rows).to_pylist()
    except Exception:  # one value Python cannot hold (a date out of range) fails them all: one at a time
        return [_one_row(batch, i) for i in rows]


def _one_row(batch: Any, i: int) -> Any:
    try:
        return batch.slice(i, 1).to_pylist()[0]
    except Exception as exc:
        return Malformed(f"a value does not convert to Python ({type(exc).__name__}: {exc})")
