NUM_GPUS = 0
"""A flood of unauthenticated frames at the controller's socket (from another
process, as fast as it can send): calls to a worker are still answered while the flood
goes on, the frames read are counted as rejected (a flood is read at a bounded pace:
the rest waits in its own queue), and the log gets a summary, not a line per frame.
The round trip under a flood is a benchmark figure: `dynarl bench transport`
(rpc_rtt_us_p99_under_flood)."""

import asyncio
import logging
import os
import subprocess
import sys
import time

import dynarl
from dynarl import RuntimeConfig
from dynarl.launch.bench.transport import start_flood, stop_flood
from dynarl.transport.rejects import REJECT_LOG_EVERY_S, RejectCounter
from workers import Echo

FLOOD_MAX_S = 120.0  # the flood stops itself then: calls not answered by then count as a stall


async def test_a_flood_of_unauthenticated_frames_does_not_stall_the_controller(caplog):
    caplog.set_level(logging.WARNING, logger="dynarl.transport.rejects")
    began = time.monotonic()
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        await group.call(Echo.hello, 0)
        flood = start_flood(ctl.router.local_address, FLOOD_MAX_S)
        try:
            while ctl.router.rejects.total < 1000:  # the flood has begun
                assert flood.poll() is None, "the flood ended before its frames arrived"
                await asyncio.sleep(0.01)
            read_before = ctl.router.rejects.total
            latencies = []
            for i in range(100):
                begun = time.perf_counter()
                assert (await group.call(Echo.hello, i))[0]["x"] == i
                latencies.append(time.perf_counter() - begun)
                await asyncio.sleep(0.005)
            # every call was answered while the flood went on, and the flood was read meanwhile
            assert flood.poll() is None, "the calls were answered only once the flood had ended"
            assert ctl.router.rejects.total > read_before
        finally:
            sent = stop_flood(flood)
        latencies.sort()
        print(f"p99 {latencies[98] * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms over 100 calls under the flood")
        rejected = ctl.router.rejects
        # (the flood's connection, closed by its end, may be counted too: it delivered no
        # authenticated message)
        assert set(rejected.counts) <= {"wrong_version", "dropped_connection"}
        assert rejected.counts["dropped_connection"] <= 1 and sent >= rejected.counts["wrong_version"] >= 1000
        assert (await group.call(Echo.hello, -1))[0]["x"] == -1
    lines = [r for r in caplog.records if "rejected" in r.getMessage()]
    # the first, then a summary per REJECT_LOG_EVERY_S and the rest at the end
    assert 2 <= len(lines) <= 2 + (time.monotonic() - began) / REJECT_LOG_EVERY_S, [r.getMessage() for r in lines]


def test_rejections_are_logged_first_then_in_summaries(caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="dynarl.transport.rejects")
    clock = [100.0]
    monkeypatch.setattr("dynarl.transport.rejects.time.monotonic", lambda: clock[0])
    rejects = RejectCounter("the controller")
    for i in range(5000):
        rejects.add("unauthenticated", f"peer{i % 3}", "bad tag")
        clock[0] += 0.001  # 5 s: inside one summary interval
    rejects.add("bad_magic", "peer9")
    clock[0] += 10.0
    rejects.add("bad_magic", "peer9")  # past the interval: the summary line
    rejects.add("truncated", "peer9")
    rejects.flush()
    assert rejects.counts == {"unauthenticated": 5000, "bad_magic": 2, "truncated": 1}
    assert [r.getMessage() for r in caplog.records] == [
        "the controller rejected a message from 'peer0': bad tag",
        "the controller rejected 5001 more messages from 4 peers in 15 s (unauthenticated 4999, bad_magic 2)",
        "the controller rejected 1 more messages from 1 peers in 0 s (truncated 1)"]


BIG_FRAME = r"""
import mmap, sys, time, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.connect(sys.argv[1])
frame = mmap.mmap(-1, 1 << 30)  # 1 GB (zeros, sent without a copy)
sock.send(b"DRL\x01" + bytes(60), zmq.SNDMORE)
sock.send(frame, copy=False)
time.sleep(float(sys.argv[2]))
sock.close(0)
ctx.term()
"""


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def test_a_1gb_frame_is_dropped_before_the_controller_allocates_it():
    """runtime.max_message_bytes (512 MB by default) is ZeroMQ's bound on a frame: the
    connection is closed when the frame's header announces more, and counted."""
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        await group.call(Echo.hello, 0)
        before, peak = _rss_mb(), 0.0
        sender = subprocess.Popen([sys.executable, "-c", BIG_FRAME, ctl.router.local_address, "3"])
        try:
            end = time.monotonic() + 60  # (the sender's start: seconds on a loaded machine)
            while ctl.router.rejects.counts["dropped_connection"] == 0 and time.monotonic() < end:
                peak = max(peak, _rss_mb())
                await asyncio.sleep(0.005)
            for _ in range(50):  # and after it: nothing arrives late
                peak = max(peak, _rss_mb())
                await asyncio.sleep(0.01)
        finally:
            sender.kill()
            sender.wait()
        assert ctl.router.rejects.counts["dropped_connection"] >= 1, ctl.router.rejects.counts
        assert peak - before < 50, f"controller RSS {before:.0f} -> {peak:.0f} MB"
        assert (await group.call(Echo.hello, 1))[0]["x"] == 1  # still serving
