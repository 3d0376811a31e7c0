"""Files written whole or not at all."""
from __future__ import annotations

import contextlib
import os
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", *, sync: bool = False) -> Iterator[IO]:
    """A file that replaces `path` when the block ends (`sync`: fsynced first). On any
    error, a full disk included, the partial temp file goes and `path` stays as it
    was: a reader never sees half a file."""
    tmp = path + ".tmp"
    try:
        with open(tmp, mode) as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
