"""The `if __name__ == "__main__":` guard a job's script needs, and its detection.

A worker process finds a Worker class defined in the user's script by importing
that script (under another name: worker_runtime.import_worker_class), as
multiprocessing's spawn does. Code at the script's top level runs again there, so
the code that starts the job (`dynarl.run(...)`, `asyncio.run(main())`) must sit
under the guard; without it the worker would start a second job inside its own
event loop. While a worker imports a script, starting a job raises
MainGuardMissing, whose message says where to put the guard.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

_importing: str | None = None
"""The script a worker is importing now, if any."""


class MainGuardMissing(RuntimeError):
    """The user's script starts a job at its top level, outside `if __name__ == "__main__":`."""


def message(script: str, what: str) -> str:
    return (f"{script} called {what} at its top level, which runs again when a worker process imports "
            "the script to find its Worker class: put the code that starts the job under "
            "`if __name__ == \"__main__\":`")


@contextlib.contextmanager
def importing(script: str) -> Iterator[None]:
    """Marks the import of `script` by a worker; a loop already running while its
    top level calls asyncio.run is reported as the missing guard."""
    global _importing
    previous, _importing = _importing, script
    try:
        yield
    except RuntimeError as exc:
        if not isinstance(exc, MainGuardMissing) and "running event loop" in str(exc):
            raise MainGuardMissing(message(script, "asyncio.run()")) from None
        raise
    finally:
        _importing = previous


def refuse_in_import(what: str) -> None:
    """Raises MainGuardMissing when a worker is importing the user's script now."""
    if _importing is not None:
        raise MainGuardMissing(message(_importing, what))
