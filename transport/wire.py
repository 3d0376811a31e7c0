"""The wire format: authenticated msgpack headers plus raw binary frames.

A message is a list of ZMQ frames:

    frame 0  header: MAGIC (3 bytes) | version (1) | mac kind (1) | nonce (16) | tag (16) | msgpack body
    frame 1+ raw buffers of tensors, arrays and blobs, referenced from the body

Never pickle: msgpack can only produce plain data, and tensors are rebuilt from
(dtype, shape, frame index), so a received message can't execute code.

Authentication covers the version, the mac kind, the nonce, the body and every
payload frame (each prefixed with its length):
- small messages (payload frames under 64 KiB): HMAC-SHA256 keyed with the job
  secret (~1.5 us per message);
- large ones: Poly1305 keyed with HMAC-SHA256(secret, nonce), a one-time key,
  hence the fresh nonce per message. Poly1305 runs at ~10 GB/s here versus
  ~1.7 GB/s for HMAC-SHA256, which matters for 100 MB tensors.
A flipped mac-kind byte changes the algorithm and so fails verification too.
"""
from __future__ import annotations

import collections.abc
import hmac
import itertools
import os
import struct
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, Sequence

import msgpack
import numpy as np
from cryptography.hazmat.primitives.poly1305 import Poly1305

from dynarl.transport.replay import ReplayWindow

MAGIC = b"DRL"
PROTOCOL_VERSION = 1
NONCE_BYTES = 16
TAG_BYTES = 16
PREAMBLE_BYTES = len(MAGIC) + 2 + NONCE_BYTES + TAG_BYTES
MAC_HMAC = 0
MAC_POLY1305 = 1
POLY1305_ABOVE_BYTES = 64 << 10
DEFAULT_MAX_MESSAGE_BYTES = 512 << 20
"""The largest message a control socket takes (runtime.max_message_bytes): ZeroMQ
drops a frame over it before allocating it (ZMQ_MAXMSGSIZE, sockets.py), and a
sender is refused one over it. Channel items over P2P_ABOVE_BYTES (data_plane.py)
and collective traffic do not cross control sockets, so their size is not bounded
by it."""

EXT_TENSOR = 1
EXT_NDARRAY = 2
EXT_BLOB = 3
EXT_REMOTE = 4
EXT_STRUCTS_FROM = 16
"""Ext codes from here on are typed records (register_struct)."""


class MessageTooLarge(ValueError):
    """A message over max_message_bytes was not sent (its receiver would drop it)."""


class WireError(Exception):
    """A message was rejected. `reason` is one of REJECT_REASONS."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


REJECT_REASONS = ("truncated", "oversized", "bad_magic", "wrong_version", "unauthenticated", "replayed",
                  "malformed")

@dataclass(slots=True)
class Blob:
    """An already-encoded value carried without decoding it (a channel item passing
    through the controller). `decode_blob` turns it back into the value."""
    body: bytes
    frames: list[Any]

    @property
    def nbytes(self) -> int:
        return len(self.body) + sum(memoryview(f).nbytes for f in self.frames)


@dataclass(frozen=True, slots=True)
class RemoteRef:
    """Where a payload waits to be fetched peer-to-peer (see data_plane.py)."""
    address: str
    id: int
    nbytes: int


class Codec:
    """Encodes and decodes messages for one job secret."""

    def __init__(self, secret: bytes, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        if len(secret) < 16:
            raise ValueError("the job secret must be at least 16 bytes")
        self._secret = secret
        self.max_message_bytes = max_message_bytes
        self._nonce_prefix = os.urandom(8)
        self._counter = itertools.count()

    # --- encode -------------------------------------------------------------
    def encode(self, body: Any) -> list[Any]:
        frames: list[Any] = []
        packed = msgpack.packb(body, default=lambda obj: _to_ext(obj, frames), use_bin_type=True)
        nonce = self._nonce_prefix + struct.pack("<Q", next(self._counter))
        payload = sum(_view(f).nbytes for f in frames)
        if PREAMBLE_BYTES + len(packed) + payload > self.max_message_bytes:
            raise MessageTooLarge(f"a message of {PREAMBLE_BYTES + len(packed) + payload} bytes is over "
                                  f"runtime.max_message_bytes ({self.max_message_bytes}); the receiver would drop it")
        kind = MAC_POLY1305 if payload > POLY1305_ABOVE_BYTES else MAC_HMAC
        tag = self._tag(kind, nonce, packed, frames)
        return [b"".join((MAGIC, bytes((PROTOCOL_VERSION, kind)), nonce, tag, packed)), *frames]

    # --- decode -------------------------------------------------------------
    def decode(self, frames: Sequence[Any], window: ReplayWindow | None = None) -> Any:
        """Checks and decodes `frames` (bytes, memoryviews or zmq.Frame); with `window`
        (the receiving socket's), a message it has taken before is refused. Raises
        WireError with the reason; the caller counts it and keeps serving."""
        views = [_view(f) for f in frames]
        if not views or views[0].nbytes < PREAMBLE_BYTES:
            raise WireError("truncated", f"{len(views)} frames")
        total = sum(v.nbytes for v in views)
        if total > self.max_message_bytes:
            raise WireError("oversized", f"{total} > {self.max_message_bytes} bytes")
        header = views[0]
        if header[:3] != MAGIC:
            raise WireError("bad_magic")
        if header[3] != PROTOCOL_VERSION:
            raise WireError("wrong_version", f"got {header[3]}, speak {PROTOCOL_VERSION}")
        kind = header[4]
        nonce = bytes(header[5:5 + NONCE_BYTES])
        tag = bytes(header[5 + NONCE_BYTES:PREAMBLE_BYTES])
        body = header[PREAMBLE_BYTES:]
        payload = views[1:]
        if kind not in (MAC_HMAC, MAC_POLY1305) or not hmac.compare_digest(
                tag, self._tag(kind, nonce, body, payload)):
            raise WireError("unauthenticated")
        if window is not None and not window.admit(nonce):
            raise WireError("replayed")
        try:
            return msgpack.unpackb(body, ext_hook=lambda code, data: _from_ext(code, data, payload),
                                   raw=False, strict_map_key=False)
        except WireError:
            raise
        except Exception as exc:  # msgpack raises many types on garbage; all mean the same
            raise WireError("malformed", f"{type(exc).__name__}: {exc}") from None

    def _tag(self, kind: int, nonce: bytes, body: Any, frames: Sequence[Any]) -> bytes:
        parts: list[Any] = [bytes((PROTOCOL_VERSION, kind)), nonce]
        for part in (body, *frames):
            view = _view(part)
            parts.append(struct.pack("<Q", view.nbytes))
            parts.append(view.cast("B") if view.ndim != 1 or view.format != "B" else view)
        if kind == MAC_HMAC:
            if sum(memoryview(p).nbytes for p in parts) <= POLY1305_ABOVE_BYTES:
                # Small messages: one contiguous buffer through the one-shot C path.
                return hmac.digest(self._secret, b"".join(parts), "sha256")[:TAG_BYTES]
            mac = hmac.new(self._secret, digestmod="sha256")  # a big one is not copied to be checked
            for part in parts:
                mac.update(part)
            return mac.digest()[:TAG_BYTES]
        poly = Poly1305(hmac.digest(self._secret, nonce, "sha256"))
        for part in parts:
            poly.update(part)
        return poly.finalize()


def encode_blob(value: Any) -> Blob:
    """Packs a value once so it can pass through intermediaries undecoded."""
    frames: list[Any] = []
    body = msgpack.packb(value, default=lambda obj: _to_ext(obj, frames), use_bin_type=True)
    return Blob(body, frames)


def decode_blob(blob: Blob) -> Any:
    payload = [_view(f) for f in blob.frames]
    return msgpack.unpackb(blob.body, ext_hook=lambda code, data: _from_ext(code, data, payload),
                           raw=False, strict_map_key=False)


# --- typed records -----------------------------------------------------------

_STRUCT_CODES: dict[type, int] = {}
_STRUCT_TYPES: dict[int, type] = {}
_CODECS: dict[type, tuple[Callable[[Any], list], Callable[[list], Any]]] = {}


def register_struct(code: int, encode: Callable[[Any], list] | None = None,
                    decode: Callable[[list], Any] | None = None, *, numbers: bool = False):
    """Class decorator: instances of a dataclass cross the wire as themselves, not as
    dicts (RPC arguments and results, channel items):

        @dynarl.register_struct(100)     # codes 100..127 are left to your own records
        @dataclass
        class Batch:
            ids: list[int]
            reward: float

    The class gives `to_wire() -> list` (plain data, arrays, tensors, other
    records) and `from_wire(list)`, or `encode` / `decode` do, or neither does: then
    its fields, in order (plain data and records), rebuilt by calling the class;
    `numbers`: each of them must be a number (bool, int, float: a flat report, such as
    TrainMetrics or RankReport). Decoding must reject what it cannot build (a malformed
    record); the receiving process must have imported the class."""
    if code < EXT_STRUCTS_FROM or code > 127:
        raise ValueError(f"struct ext codes are {EXT_STRUCTS_FROM}..127, not {code}")

    def register(cls):
        if _STRUCT_TYPES.get(code, cls) is not cls:
            raise ValueError(f"ext code {code} is {_STRUCT_TYPES[code].__name__}'s")
        _STRUCT_CODES[cls], _STRUCT_TYPES[code] = code, cls
        own = (cls.to_wire, cls.from_wire) if hasattr(cls, "to_wire") else _by_fields(cls, numbers)
        _CODECS[cls] = (encode or own[0], decode or own[1])
        return cls
    return register


def _by_fields(cls: type, numbers: bool = False) -> tuple[Callable[[Any], list], Callable[[list], Any]]:
    """A dataclass's codec from its fields: their values in order; a record of another
    length is malformed, and with `numbers` one whose field is no number (the class's
    own checks, __post_init__, run as it is built)."""
    names = [f.name for f in fields(cls)]

    def decode(values: list) -> Any:
        if not isinstance(values, list) or len(values) != len(names):
            raise ValueError(f"expected {len(names)} fields")
        if numbers:
            for name, value in zip(names, values):
                if not isinstance(value, (int, float)):
                    raise ValueError(f"{name}: expected a number, got {value!r}")
        return cls(**dict(zip(names, values)))
    return (lambda obj: [getattr(obj, name) for name in names]), decode


# --- tensors and arrays as frames ---------------------------------------------

def _to_ext(obj: Any, frames: list[Any]) -> msgpack.ExtType:
    code = _STRUCT_CODES.get(type(obj))
    if code is not None:
        return msgpack.ExtType(code, msgpack.packb(_CODECS[type(obj)][0](obj), default=lambda o: _to_ext(o, frames),
                                                   use_bin_type=True))
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        frames.append(arr.reshape(-1).view(np.uint8) if arr.size else b"")
        meta = [len(frames) - 1, arr.dtype.str, list(arr.shape)]
        return msgpack.ExtType(EXT_NDARRAY, msgpack.packb(meta))
    if isinstance(obj, RemoteRef):
        return msgpack.ExtType(EXT_REMOTE, msgpack.packb([obj.address, obj.id, obj.nbytes]))
    if isinstance(obj, Blob):
        first = len(frames)
        frames.extend(obj.frames)
        return msgpack.ExtType(EXT_BLOB, msgpack.packb([obj.body, first, len(obj.frames)], use_bin_type=True))
    if type(obj).__module__ == "torch" and type(obj).__name__ in ("Tensor", "Parameter"):
        return _tensor_to_ext(obj, frames)
    if isinstance(obj, collections.abc.Sequence) and not isinstance(obj, (str, bytes, bytearray)):
        return list(obj)  # a sequence built on first read (the emulated engines' outputs), or a range
    raise TypeError(unsendable(type(obj)))


USER_STRUCT_CODES = range(100, 128)
"""Ext codes left to a user's own records: dynarl's own records take codes below 100."""


def unsendable(cls: type) -> str:
    """Why an instance of `cls` cannot cross the wire, and how to make it."""
    module = "__main__" if cls.__module__ == "__dynarl_main__" else cls.__module__  # (a worker's import of the script)
    name = f"{module}.{cls.__qualname__}"
    how = (f"decorate it with @dynarl.register_struct(CODE) above @dataclass, CODE a number in "
           f"{USER_STRUCT_CODES.start}..{USER_STRUCT_CODES.stop - 1} of its own, and define it where the "
           "receiving workers' classes are (a process decodes only the records it has imported)")
    if is_dataclass(cls):
        return f"cannot send a {name} over the wire: a dataclass crosses once registered: {how}"
    return (f"cannot send a {name} over the wire: send plain data (None, bool, int, float, str, bytes, lists, "
            f"dicts), numpy arrays, torch tensors, or a dataclass registered as a record ({how})")


def _tensor_to_ext(t: Any, frames: list[Any]) -> msgpack.ExtType:
    import torch
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    # A uint8 view keeps bfloat16 (which numpy lacks) zero-copy.
    frames.append(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return msgpack.ExtType(EXT_TENSOR, msgpack.packb([len(frames) - 1, dtype, list(t.shape)]))


def _from_ext(code: int, data: bytes, frames: Sequence[memoryview]) -> Any:
    if code >= EXT_STRUCTS_FROM:
        cls = _STRUCT_TYPES.get(code)
        if cls is None:
            raise WireError("malformed", f"unknown ext type {code}")
        fields = msgpack.unpackb(data, ext_hook=lambda c, d: _from_ext(c, d, frames), raw=False,
                                 strict_map_key=False)
        try:
            return _CODECS[cls][1](fields)
        except (TypeError, ValueError, LookupError) as exc:  # (LookupError: a field's plain data lacks a key)
            raise WireError("malformed", f"bad {cls.__name__}: {exc}") from None
    meta = msgpack.unpackb(data, raw=False)
    if code == EXT_REMOTE:
        address, ref_id, nbytes = meta
        if not (isinstance(address, str) and isinstance(ref_id, int) and isinstance(nbytes, int)):
            raise WireError("malformed", "bad remote reference")
        return RemoteRef(address, ref_id, nbytes)
    if code == EXT_BLOB:
        body, first, count = meta
        if first < 0 or first + count > len(frames):
            raise WireError("malformed", "blob frame index out of range")
        return Blob(body, list(frames[first:first + count]))
    index, dtype, shape = meta
    if not 0 <= index < len(frames):
        raise WireError("malformed", f"frame index {index} out of range")
    buf = frames[index]
    if code == EXT_NDARRAY:
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise WireError("malformed", "object arrays are not accepted")
        arr = np.frombuffer(buf, dtype=dt) if buf.nbytes else np.empty(0, dt)
        _check_size(arr.size, shape)
        return arr.reshape(shape)
    if code == EXT_TENSOR:
        import torch
        tdtype = getattr(torch, dtype, None)
        if not isinstance(tdtype, torch.dtype):
            raise WireError("malformed", f"unknown tensor dtype {dtype!r}")
        if buf.nbytes == 0:
            _check_size(0, shape)
            return torch.empty(shape, dtype=tdtype)
        # Received ZMQ frames are writable, so the tensor can alias the frame memory.
        flat = torch.frombuffer(buf, dtype=torch.uint8)
        if flat.numel() % tdtype.itemsize:
            raise WireError("malformed", "tensor bytes not a multiple of the item size")
        t = flat.view(tdtype)
        _check_size(t.numel(), shape)
        return t.reshape(shape)
    raise WireError("malformed", f"unknown ext type {code}")


def _check_size(n: int, shape: Any) -> None:
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise WireError("malformed", f"bad shape {shape!r}")
    if int(np.prod(shape, dtype=np.int64)) != n:
        raise WireError("malformed", f"shape {shape} does not match {n} elements")


def _view(frame: Any) -> memoryview:
    if isinstance(frame, memoryview):
        return frame
    buffer = getattr(frame, "buffer", None)  # zmq.Frame
    if buffer is not None:
        return buffer
    return memoryview(frame)
