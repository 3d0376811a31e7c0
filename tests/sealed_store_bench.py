"""What sealing a process group's store costs (transport/sealed_store.py): store calls
through c10d's PrefixStore over a plain TCPStore and over a SealedStore, and the
build of a two-rank gloo group both ways. `python tests/sealed_store_bench.py`;
docs/benchmarks.md has its figures."""
import datetime
import statistics
import threading
import time

import torch.distributed as dist

from dynarl.transport.process_group import _group, host_store, join_group, leave_group, unregister
from dynarl.transport.sealed_store import SealedStore, build_key

SECRET, TIMEOUT = b"k" * 32, datetime.timedelta(seconds=30)
CALLS = [  # (what, call, calls per timing)
    ("set+get 100 B", lambda s, i: (s.set(f"k{i}", b"x" * 100), s.get(f"k{i}")), 1000),
    ("add", lambda s, i: s.add("n", 1), 1000),
    ("check", lambda s, i: s.check(["k1"]), 1000),
    ("set+get+delete 4 MiB", lambda s, i: (s.set("big", b"x" * (4 << 20)), s.get("big"), s.delete_key("big")), 10),
]


def _client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)


def _per_call_us(store, call, n: int) -> float:
    begun = time.perf_counter()
    for i in range(n):
        call(store, i)
    return (time.perf_counter() - begun) / n * 1e6


def _build_ms(sealed: bool, rep: int) -> float:
    server = host_store("127.0.0.1")
    members: list = [None, None]
    prefix = f"dynarl/bench/{rep}/x"

    def rank(r: int) -> None:
        store = server if r == 0 else _client(server.port)
        if sealed:
            members[r] = join_group("bench", prefix, r, 2, "127.0.0.1", server.port, "gloo", 30.0, store=store,
                                    secret=SECRET)
        else:
            members[r] = _group(dist.PrefixStore(prefix, store), r, 2, "gloo", TIMEOUT, None)[0]

    begun = time.perf_counter()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = (time.perf_counter() - begun) * 1e3
    for member in members:
        leave_group(member) if sealed else unregister(member)
    return took


def main() -> None:
    server = host_store("127.0.0.1")
    plain = dist.PrefixStore("plain", _client(server.port))
    sealed = dist.PrefixStore("sealed", SealedStore(_client(server.port), build_key(SECRET, "sealed")))
    for what, call, n in CALLS:  # interleaved, best of 5: this machine is shared
        times = [(_per_call_us(plain, call, n), _per_call_us(sealed, call, n)) for _ in range(5)]
        print(f"{what:22s} plain {min(p for p, _ in times):9.1f} us  sealed {min(s for _, s in times):9.1f} us")
    builds = [(_build_ms(False, rep), _build_ms(True, rep)) for rep in range(15)]
    print(f"{'2-rank gloo group build':22s} plain {statistics.median(p for p, _ in builds):9.1f} ms  "
          f"sealed {statistics.median(s for _, s in builds):9.1f} ms  (median of 15)")


if __name__ == "__main__":
    main()
