"""What sealing and verifying a checkpoint costs (components/workflows/manifest.py):
crc32 of every file, on threads. Two sizes: the built-in job's checkpoint (one 8 MiB
shard of a 0.5M-parameter model: master, two moments, gradient) and 1 GiB in four
shards; files in the page cache, as right after a checkpoint is written. Best of 5.
Also crc32 against sha256 and blake2b on one 256 MiB buffer (why crc32).

    python tests/manifest_bench.py
"""
import hashlib
import os
import tempfile
import time
import zlib

from dynarl.components.workflows import manifest


def best(fn, n=5):
    times = []
    for _ in range(n):
        begun = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begun)
    return min(times)


def checkpoint(path, files, size):
    os.makedirs(path)
    for rank in range(files):
        with open(os.path.join(path, f"shard-{rank:05d}-of-{files:05d}.safetensors"), "wb") as f:
            for _ in range(size // (8 << 20)):
                f.write(os.urandom(8 << 20))


def main():
    print(f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, files, size in (("8 MiB, 1 file", 1, 8 << 20), ("1 GiB, 4 files", 4, 256 << 20)):
            path = os.path.join(tmp, name.replace(" ", "_").replace(",", ""))
            checkpoint(path, files, size)
            total = files * size
            seal, verify = best(lambda: manifest.seal(path)), best(lambda: manifest.verify(path))
            print(f"{name}: seal {seal * 1e3:.1f} ms ({total / seal / 1e9:.2f} GB/s), "
                  f"verify {verify * 1e3:.1f} ms ({total / verify / 1e9:.2f} GB/s)")
    data = os.urandom(256 << 20)
    for name, fn in (("crc32", lambda: zlib.crc32(data)), ("sha256", lambda: hashlib.sha256(data).digest()),
                     ("blake2b", lambda: hashlib.blake2b(data).digest())):
        print(f"{name}: {len(data) / best(fn, 3) / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
