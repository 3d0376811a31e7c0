"""Files written whole or not at all."""
from __future__ import annotations

import contextlib
import os
import secrets
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", *, sync: bool = False) -> Iterator[IO]:
    """A file that replaces `path` when the block ends (`sync`: fsynced first). On any
    error, a full disk included, the partial temp file goes and `path` stays as it
    was: a reader never sees half a file. The temp file's name is this writer's own
    (pid and a random part, created exclusively), so writers of the same path, in
    one process or several, never write into each other's: the last replace wins."""
    tmp = f"{path}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, mode.replace("w", "x")) as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
