"""A checkpoint's manifest: `manifest.json`, every file's size and crc32.

The manifest is the last file a checkpoint gets, written atomically after every
other file is complete (`seal`), and the checksums are read back from the disk, so
they describe what a reader will find. `verify` reads every file again and names the
first that differs: which file, what the manifest expected, what was found. A
checkpoint being rewritten (a resumed run reaching the step of a checkpoint from its
earlier history) loses its manifest first (`unseal`), so a crash mid-write leaves a
checkpoint that does not pass.

crc32 (zlib), not a cryptographic hash: the threat is a disk, a copy or a crash
changing bytes, not someone forging them (who could rewrite the manifest too). crc32
catches every burst error of up to 32 bits and misses a random corruption with
probability 2^-32, and it is the fastest checksum in the standard library (1.3-2.4x
sha256 here, docs/benchmarks.md); files are hashed on threads (zlib lets go of the GIL).
"""
from __future__ import annotations

import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dynarl.core.files import atomic_open

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
CHUNK = 8 << 20
"""Bytes read at a time: memory stays bounded on a many-GB shard."""


@dataclass(frozen=True, slots=True)
class FileRecord:
    size: int
    crc32: int

    def describe(self) -> str:
        return f"{self.size} bytes, crc32 {self.crc32:08x}"


def record(file: str) -> FileRecord:
    crc, size = 0, 0
    with open(file, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return FileRecord(size, crc)


def checkpoint_files(path: str) -> list[str]:
    """Every file under `path` (relative, sorted) but the manifest and temp files."""
    found = []
    for root, _, names in os.walk(path):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), path)
            if rel != MANIFEST_FILE and not name.endswith(".tmp"):
                found.append(rel)
    return sorted(found)


def records(path: str, names: list[str]) -> list[FileRecord | None]:
    """Each named file's record, None where it is missing."""
    def one(name: str) -> FileRecord | None:
        try:
            return record(os.path.join(path, name))
        except FileNotFoundError:
            return None
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(names)))) as pool:
        return list(pool.map(one, names))


def seal(path: str) -> None:
    """Writes the manifest of every file now in `path`, atomically and fsynced."""
    names = checkpoint_files(path)
    files = {name: {"size": r.size, "crc32": r.crc32} for name, r in zip(names, records(path, names))
             if r is not None}  # (one removed since the listing)
    with atomic_open(os.path.join(path, MANIFEST_FILE), sync=True) as f:
        json.dump({"format_version": FORMAT_VERSION, "algorithm": "crc32", "files": files}, f, indent=1)


def unseal(path: str) -> None:
    """Before a checkpoint directory is written again: it stops passing until sealed."""
    try:
        os.remove(os.path.join(path, MANIFEST_FILE))
    except FileNotFoundError:
        pass


def is_sealed(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST_FILE))


def read_manifest(path: str) -> dict[str, FileRecord]:
    """The manifest's files; ValueError when it cannot be read as one."""
    try:
        with open(os.path.join(path, MANIFEST_FILE)) as f:
            manifest = json.load(f)
        if manifest["format_version"] != FORMAT_VERSION or manifest["algorithm"] != "crc32":
            raise ValueError(f"format_version {manifest['format_version']}, algorithm {manifest['algorithm']}")
        return {name: FileRecord(int(r["size"]), int(r["crc32"])) for name, r in manifest["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{MANIFEST_FILE}: unreadable ({type(exc).__name__}: {exc})") from None


def verify(path: str) -> str | None:
    """None when every file in the manifest is there with its size and crc32; else
    the first that is not: 'FILE: expected ..., found ...'."""
    try:
        expected = read_manifest(path)
    except (ValueError, OSError) as exc:
        return str(exc)
    names = sorted(expected)
    for name, found in zip(names, records(path, names)):
        if found != expected[name]:
            return f"{name}: expected {expected[name].describe()}, found {found.describe() if found else 'no file'}"
    return None
