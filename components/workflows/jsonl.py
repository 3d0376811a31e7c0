"""The run directory's JSON-lines files (metrics.jsonl, ledger.jsonl): appends that a
crash or a full disk cannot tear, and reads that survive a torn tail.

`append` writes a record as one whole line with one write on an O_APPEND file;
when the write fails part-way (ENOSPC, EDQUOT, EIO) the file is cut back to its
length before it, so it never ends inside a record. `sync=True` fsyncs (the
ledger at each step commit). A crash between the write and the fsync can still
leave a torn last line (the kernel may persist part of it): `read` drops a last
line without its newline, and resume `rewrite`s the file from what `read` kept,
so `--resume` goes on from the last whole record. A bad line anywhere else is not
a torn tail but a damaged file: an error naming the file and line.
"""
from __future__ import annotations

import json
import os
from typing import Any

from dynarl.core.files import atomic_open


class DamagedFile(ValueError):
    """A JSON-lines file holds a record that is not a torn tail and does not parse."""


def append(path: str, record: Any, *, sync: bool = False) -> None:
    data = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            if sync:
                os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, before)
            except OSError:
                pass  # read() still drops the torn tail
            raise
    finally:
        os.close(fd)


def rewrite(path: str, records: list[Any]) -> None:
    """Replaces the file's content with `records`, atomically."""
    with atomic_open(path, sync=True) as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def read(path: str) -> list[Any]:
    """The file's whole records (none if it does not exist), a torn last line dropped."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    records: list[Any] = []
    lines = data.split(b"\n")[:-1]  # the part after the last newline: empty, or a line cut short
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise DamagedFile(f"{path}:{number}: not a JSON record ({exc}); the file is damaged") from None
    return records


def roll_back(path: str, step: int) -> None:
    """Keeps the JSON lines of steps before `step`; moves the rest to *.rolled_back.jsonl
    (a torn last line, from a crash mid-append, goes)."""
    if not os.path.exists(path):
        return
    records = read(path)
    for dropped in (r for r in records if r["step"] >= step):
        append(path.removesuffix(".jsonl") + ".rolled_back.jsonl", dropped)
    rewrite(path, [r for r in records if r["step"] < step])
