"""A small tmpfs the test mounts itself (and always unmounts): a disk that fills up
or is read-only, for the run directory's failure modes. Needs root (CAP_SYS_ADMIN);
skipped, with the reason, where mounting is not allowed."""
import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(path, size="64m", read_only=False):
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(directory):
    """Writes a file until the disk is full; returns its path (remove it to free the space)."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError as exc:
        assert exc.errno == 28, exc
    finally:
        os.close(fd)
    return path
