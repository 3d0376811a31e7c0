"""A process group's store, sealed with a key only the job's processes can compute.

A TCPStore serves any client that reaches its port (another user of the host, any
host of the network) and lists its keys to it. So each group's store is wrapped:

    key names   HMAC-SHA256 of the full key (prefixes included), 32 hex characters
    values      AES-256-GCM, a random 96-bit nonce, the stored name as associated
                data: a value moved to another key, cut, or written by anyone
                without the key fails to open (`StoreTampered`), never used
    counters    `add` is a compare-and-set of sealed values, so a count is neither
                readable nor movable from outside either

The key of one build is HMAC(job secret, its key prefix) (`build_key`): the prefix
travels to the members, the job secret never leaves the job's processes. An
outsider still sees how many keys there are, their sizes and when they change, and
can delete them or overwrite them (the members then fail with `StoreTampered`, or
wait for a key that is gone until their timeout): a denial of service, not a read
or a forgery. It can also put back a value a key held earlier: an older count
(members then wait for a count until their timeout); the other keys are written
once per build (gloo's addresses, NCCL's unique ids, numbered hand-offs).

c10d calls a Python Store through its pybind trampoline (torch/csrc/distributed/c10d/
init.cpp PythonStore): set, get, compare_set, add, check, wait (with and without a
timeout), deleteKey and getNumKeys (their C++ names), clone, append, multi_get,
multi_set, has_extended_api. Store.barrier's default runs on add, set and wait;
list_keys and the queues are not offered (c10d's groups use neither). Gloo calls
set, wait and get at its rendezvous (run here). NCCL, as read in torch's source
(not run: no GPU here), calls set/get for its unique ids, also those of the
point-to-point communicators it makes lazily (so the store serves members for the
group's whole life), multi_get with several roots, and from its watchdog and
monitor threads check/get/set of its dump and error signals, each taking the GIL.
The waits run on the TCPStore's own timeout (the group's).

The Python object must outlive every c10d object built on it: the trampoline finds
its methods through it (an "INTERNAL ASSERT FAILED ... Not implemented" once it is
collected), and the C++ objects that hold the store hold no reference to it. So each
one stays registered here until `close()` (leave_group, after the group's backends
shut down); `clone` returns the same object (the TCPStore client under it
serialises its calls, as it did for the PrefixStore it replaces).
"""
from __future__ import annotations

import datetime
import hmac
import os
from typing import Callable

import torch.distributed as dist
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dynarl.transport.errors import DynarlError

NONCE_BYTES = 12
NAME_HEX = 32
_open_stores: dict[int, "SealedStore"] = {}
"""Every SealedStore not closed yet, kept alive for the C++ objects that use it."""


class StoreTampered(DynarlError):
    """A value in a group's store did not open with the group's key: written by a
    process without the job secret, or moved there from another key."""


def build_key(secret: bytes, prefix: str) -> bytes:
    """The key of one build of a group: only holders of the job secret compute it."""
    if len(secret) < 16:
        raise ValueError("the job secret must be at least 16 bytes")
    return hmac.digest(secret, b"dynarl/process-group-store\0" + prefix.encode(), "sha256")


class SealedStore(dist.Store):
    """`inner` (a TCPStore) with every key name hashed and every value sealed under `key`."""

    def __init__(self, inner: dist.Store, key: bytes) -> None:
        super().__init__()
        self.inner = inner
        self._names = hmac.digest(key, b"names", "sha256")
        self._aead = AESGCM(hmac.digest(key, b"values", "sha256"))
        self.set_timeout(inner.timeout)  # type: ignore[attr-defined]  # not in torch's stubs
        _open_stores[id(self)] = self

    def close(self) -> None:
        """Lets this store go once nothing in Python holds it: call it only when no c10d
        object built on it is used again."""
        _open_stores.pop(id(self), None)

    # --- what c10d and the members call --------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        name = self._name(key)
        self.inner.set(name, self._seal(name, _bytes(value)))  # type: ignore[arg-type]  # c10d takes bytes

    def get(self, key: str) -> bytes:
        name = self._name(key)
        return self._open(name, self.inner.get(name))

    def add(self, key: str, value: int) -> int:
        _, new = self._swap(key, lambda old: str(int(old or b"0") + value).encode())
        assert new is not None  # the change above always gives a value
        return int(new)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """TCPStore's answers: the new value when it was `expected` (or missing and
        `expected` empty), else what is there (`expected` for a missing key)."""
        expected, desired = _bytes(expected), _bytes(desired)

        def change(old: bytes | None) -> bytes | None:
            matches = old == expected if old is not None else not expected
            return desired if matches else None
        _, new = self._swap(key, change)
        return expected if new is None else new

    def append(self, key: str, value: bytes | str) -> None:
        self._swap(key, lambda old: (old or b"") + _bytes(value))

    def check(self, keys: list[str]) -> bool:
        return self.inner.check([self._name(k) for k in keys])

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        names = [self._name(k) for k in keys]
        if timeout is None:
            self.inner.wait(names)
        else:
            self.inner.wait(names, timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        names = [self._name(k) for k in keys]
        return [self._open(n, v) for n, v in zip(names, self.inner.multi_get(names))]

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        names = [self._name(k) for k in keys]
        sealed = [self._seal(n, _bytes(v)) for n, v in zip(names, values)]
        self.inner.multi_set(names, sealed)  # type: ignore[attr-defined]  # not in torch's stubs

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the name the trampoline looks up
        return self.inner.delete_key(self._name(key))

    def getNumKeys(self) -> int:  # noqa: N802 - the name the trampoline looks up
        return self.inner.num_keys()

    def has_extended_api(self) -> bool:
        return True

    def clone(self) -> "SealedStore":
        return self

    # --- sealing ---------------------------------------------------------------------
    def _name(self, key: str) -> str:
        return hmac.new(self._names, key.encode(), "sha256").hexdigest()[:NAME_HEX]

    def _seal(self, name: str, value: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, value, name.encode())

    def _open(self, name: str, sealed: bytes) -> bytes:
        view = memoryview(sealed)  # no copy of a large value to slice it
        try:
            return self._aead.decrypt(view[:NONCE_BYTES], view[NONCE_BYTES:], name.encode())
        except (InvalidTag, ValueError):
            raise StoreTampered(f"the value at store key {name} ({len(sealed)} bytes) does not open with this "
                                "group's key: written by a process without the job secret, or moved from "
                                "another key") from None

    def _swap(self, key: str, change: Callable[[bytes | None], bytes | None]) -> tuple[bytes | None, bytes | None]:
        """Replaces the value at `key` with change(its plaintext, None if missing) in one
        compare-and-set of sealed values, retried while another member wins the race;
        change returning None leaves it. Returns (old, new) plaintexts. The first try
        assumes a missing key: on a fresh key it is the only round trip, on a set one
        its answer is the current value."""
        name = self._name(key)
        sealed_old, old, known = b"", None, False
        while True:
            new = change(old)
            if new is None:
                if known or not self.inner.check([name]):
                    return old, old
                sealed_old = self.inner.get(name)
                old, known = self._open(name, sealed_old), True
                continue
            sealed_new = self._seal(name, new)
            got = self.inner.compare_set(name, sealed_old, sealed_new)  # type: ignore[arg-type]  # c10d takes bytes
            if got == sealed_new:
                return old, new
            known = True
            if got == sealed_old:  # TCPStore's answer for a key deleted meanwhile
                sealed_old, old = b"", None
            else:
                sealed_old, old = got, self._open(name, got)


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
