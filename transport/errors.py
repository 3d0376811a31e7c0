"""The runtime's named failure modes.

Each says who is at fault: the remote code (RemoteError), a peer that vanished
(WorkerLost), our own closed resource (ChannelClosed), or user input (ConfigError).
"""
from __future__ import annotations


class DynarlError(Exception):
    """Base of every error the runtime raises on purpose."""


class RemoteError(DynarlError):
    """A worker method raised. Carries the remote type name and traceback text."""

    def __init__(self, worker: str, method: str, type_name: str, message: str, traceback: str) -> None:
        super().__init__(f"{worker}.{method} raised {type_name}: {message}\n--- remote traceback ---\n{traceback}")
        self.worker = worker
        self.method = method
        self.type_name = type_name
        self.remote_message = message
        self.remote_traceback = traceback


class WorkerLost(DynarlError):
    """A worker died or stopped answering; calls to it fail with this, never hang."""

    def __init__(self, worker: str, reason: str) -> None:
        super().__init__(f"worker {worker} lost: {reason}")
        self.worker = worker
        self.reason = reason


class ChannelClosed(DynarlError):
    """The channel was closed (by us) and holds nothing more for this getter."""


class SpawnError(DynarlError):
    """A worker could not be started or did not come up in time."""


class ConfigError(DynarlError, ValueError):
    """A config value is wrong; the message names the field path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
