"""What the dashboard reads from a run directory while the run writes it: its JSON-lines
files read incrementally (only what was appended since the last read), and config.yaml.

A file that shrank or was replaced (a resume rolls metrics.jsonl back: a new file) is
read again from its start. A torn last line (the writer is mid-append) is left for the
next read, as jsonl.read drops it. Reads come from the server's worker threads: each
file has a lock.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any

import yaml

from dynarl.components.workflows.sample_text import TEXT_FILE
from dynarl.components.workflows.span_log import SPANS_FILE

METRICS_FILE = "metrics.jsonl"


class JsonlTail:
    """A JSON-lines file's records, kept up to date by reading what was appended."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._records: list[Any] = []
        self._offset = 0
        self._inode: int | None = None
        self._lock = threading.Lock()

    def records(self) -> list[Any]:
        """Every whole record now in the file (a copy of the list)."""
        with self._lock:
            self._refresh()
            return list(self._records)

    def _refresh(self) -> None:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self._inode or st.st_size < self._offset:  # replaced or cut back: again
                    self._records, self._offset, self._inode = [], 0, st.st_ino
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            self._records, self._offset, self._inode = [], 0, None
            return
        end = data.rfind(b"\n") + 1  # a line not ended yet waits for the next read
        for line in data[:end].split(b"\n"):
            if line.strip():
                try:
                    self._records.append(json.loads(line))
                except ValueError:
                    continue  # (a damaged line: the run's own reader reports it; the page shows the rest)
        self._offset += end


class RunFiles:
    """A run directory's files, as the dashboard reads them."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.metrics = JsonlTail(os.path.join(run_dir, METRICS_FILE))
        self.spans = JsonlTail(os.path.join(run_dir, SPANS_FILE))
        self.samples = JsonlTail(os.path.join(run_dir, TEXT_FILE))
        self._config: dict[str, Any] | None = None

    def config(self) -> dict[str, Any]:
        """config.yaml as written at the run's start ({} until it is)."""
        if self._config is None:
            try:
                with open(os.path.join(self.run_dir, "config.yaml")) as f:
                    self._config = yaml.safe_load(f) or {}
            except (FileNotFoundError, yaml.YAMLError):
                return {}
        return self._config
