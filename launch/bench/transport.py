"""`dynarl bench transport`: RPC round trip (also under a flood of unauthenticated
frames), channel throughput, runtime-group tensor bandwidth, the floor under the round
trip (a bare ZeroMQ echo, zmq_floor.py), and Ray's actor round trip side by side when
Ray is importable.

All figures come from one run on this machine, so ratios are like for like.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

from dynarl.core.config import RuntimeConfig
from dynarl.core.controller import Controller
from dynarl.components.probe import ProbeWorker
from dynarl.launch.bench.zmq_floor import measure_zmq_floor

FLOOD = r"""
import os, signal, sys, time, zmq
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.connect(sys.argv[1])
frame, sent, end = b"DRL\x00" + os.urandom(59), 0, time.monotonic() + float(sys.argv[2])
while not stop and time.monotonic() < end:
    try:
        sock.send(frame, zmq.NOBLOCK)
        sent += 1
    except zmq.Again:
        time.sleep(0.0005)
print(sent, flush=True)
sock.close(0)
ctx.term()
"""
"""A peer that sends frames of protocol version 0 (each one rejected as wrong_version) as
fast as it can, until SIGTERM or argv[2] seconds; it prints how many it sent."""


def start_flood(address: str, max_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", FLOOD, address, str(max_s)], stdout=subprocess.PIPE, text=True)


def stop_flood(flood: subprocess.Popen) -> int:
    """Ends the flood; how many frames it sent."""
    flood.terminate()
    return int(flood.communicate(timeout=60)[0] or 0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(args: argparse.Namespace) -> dict:
    out: dict = {}
    async with Controller(RuntimeConfig(launcher="local")) as ctl:
        workers = await ctl.spawn(ProbeWorker, num_ranks=2)
        one = workers.handles[0]
        for _ in range(200):  # warm up
            await one.call(ProbeWorker.noop)
        worker_before, here_before = await one.call(ProbeWorker.cpu_times), (time.process_time(), time.thread_time())
        rtts = await round_trips(one, ProbeWorker.noop, args.rpc_calls)
        here_after, worker_after = (time.process_time(), time.thread_time()), await one.call(ProbeWorker.cpu_times)
        out["rpc_rtt_us_p50"] = round(percentile(rtts, 0.50), 1)
        out["rpc_rtt_us_p99"] = round(percentile(rtts, 0.99), 1)
        out["rpc_cpu_us_per_call"] = cpu_split(here_before, here_after, worker_before, worker_after, args.rpc_calls)
        # the same with an `async def` no-op: it runs as a task on the worker (no fast path)
        rtts = await round_trips(one, ProbeWorker.noop_async, args.rpc_calls)
        out["rpc_async_rtt_us_p50"] = round(percentile(rtts, 0.50), 1)
        _progress(f"rpc: p50 {out['rpc_rtt_us_p50']} us (async method {out['rpc_async_rtt_us_p50']} us) "
                  f"over {args.rpc_calls} calls")

        n = args.small_items
        consumed, _ = await asyncio.gather(workers.on([1]).call(ProbeWorker.consume, "small", n, 64),
                                           workers.on([0]).call(ProbeWorker.produce, "small", n, 8))
        out["channel_items_per_s"] = round(consumed[0]["items"] / consumed[0]["seconds"])
        _progress(f"channel: {out['channel_items_per_s']} small items/s")

        n = args.mb_items
        consumed, _ = await asyncio.gather(workers.on([1]).call(ProbeWorker.consume, "large", n, 8),
                                           workers.on([0]).call(ProbeWorker.produce, "large", n, 1 << 20))
        out["channel_mb_per_s"] = round(consumed[0]["bytes"] / (1 << 20) / consumed[0]["seconds"])
        _progress(f"channel: {out['channel_mb_per_s']} MB/s with 1 MB items")

        await ctl.process_group("bench", [workers])
        numel = 100 * (1 << 20) // 4
        times, _ = await asyncio.gather(workers.on([1]).call(ProbeWorker.p2p_recv, "bench", numel, args.p2p_repeats),
                                        workers.on([0]).call(ProbeWorker.p2p_send, "bench", numel, args.p2p_repeats))
        out["p2p_tensor_mb_per_s"] = round(100 / statistics.median(times[0]))
        _progress(f"p2p: {out['p2p_tensor_mb_per_s']} MB/s for 100 MB over gloo")

        flood = start_flood(ctl.router.local_address, 600)
        try:
            while ctl.router.rejects.total < 1000:  # the flood has begun
                if flood.poll() is not None:
                    raise RuntimeError("the flood ended before its frames arrived")
                await asyncio.sleep(0.01)
            flooded = await round_trips(one, ProbeWorker.noop, args.rpc_calls)
        finally:
            stop_flood(flood)
        out["rpc_rtt_us_p99_under_flood"] = round(percentile(flooded, 0.99), 1)
        _progress(f"rpc under a flood of unauthenticated frames: p99 {out['rpc_rtt_us_p99_under_flood']} us")
    return out


def measure_floors_and_ray(out: dict, args: argparse.Namespace) -> None:
    """The bare-ZeroMQ floors (zmq_floor.py; outside our loop: the loop variant runs its
    own) and Ray, added to `out`."""
    floor = percentile(measure_zmq_floor(args.rpc_calls), 0.50)
    out["zmq_floor_rtt_us_p50"] = round(floor, 1)
    out["zmq_loop_floor_rtt_us_p50"] = round(percentile(measure_zmq_floor(args.rpc_calls, loop=True), 0.50), 1)
    _progress(f"floor: a bare ZeroMQ echo between two processes takes {out['zmq_floor_rtt_us_p50']} us "
              f"blocking, {out['zmq_loop_floor_rtt_us_p50']} us driven by uvloop on both ends")
    ray_p50 = None if args.no_ray else measure_ray(args.rpc_calls)
    if ray_p50 is not None:
        out["ray_rtt_us_p50"] = round(ray_p50, 1)
        out["rtt_speedup_vs_ray"] = round(ray_p50 / out["rpc_rtt_us_p50"], 2)
        out["zmq_floor_speedup_vs_ray"] = round(ray_p50 / floor, 2)  # the most any RPC over ZeroMQ could reach
        out["zmq_loop_floor_speedup_vs_ray"] = round(ray_p50 / out["zmq_loop_floor_rtt_us_p50"], 2)  # ... from a loop


async def round_trips(handle, method, calls: int) -> list[float]:
    """Microseconds per call, one call at a time."""
    rtts = []
    for _ in range(calls):
        start = time.perf_counter()
        await handle.call(method)
        rtts.append((time.perf_counter() - start) * 1e6)
    return rtts


def cpu_split(here_before, here_after, worker_before, worker_after, calls: int) -> dict[str, float]:
    """CPU microseconds per round trip: each side's main thread and its other threads
    (zmq's I/O thread). On a machine with fewer free cores than busy threads these run
    one after another, so their sum bounds the round trip from below. (The controller's
    figure includes the two cpu_times calls around the loop.)"""
    def per_call(before, after, i):
        return round((after[i] - before[i]) / calls * 1e6, 1)
    return {"controller_main": per_call(here_before, here_after, 1),
            "controller_other_threads": round(per_call(here_before, here_after, 0)
                                              - per_call(here_before, here_after, 1), 1),
            "worker_main": per_call(worker_before, worker_after, 1),
            "worker_other_threads": round(per_call(worker_before, worker_after, 0)
                                          - per_call(worker_before, worker_after, 1), 1)}


def measure_ray(calls: int) -> float | None:
    try:
        import ray
    except ImportError:
        return None
    _progress("ray: starting a local cluster for the side-by-side round trip")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        @ray.remote
        class Noop:
            def noop(self) -> None:
                return None

        actor = Noop.remote()
        for _ in range(200):
            ray.get(actor.noop.remote())
        rtts = []
        for _ in range(calls):
            start = time.perf_counter()
            ray.get(actor.noop.remote())
            rtts.append((time.perf_counter() - start) * 1e6)
        return percentile(rtts, 0.50)
    finally:
        ray.shutdown()


def _progress(message: str) -> None:
    print(f"[bench transport] {message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench transport")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rpc-calls", type=int, default=3000)
    parser.add_argument("--small-items", type=int, default=50_000)
    parser.add_argument("--mb-items", type=int, default=300)
    parser.add_argument("--p2p-repeats", type=int, default=5)
    parser.add_argument("--no-ray", action="store_true", help="skip Ray's round trip even when Ray is installed")
    args = parser.parse_args(argv)
    import uvloop
    result = uvloop.run(measure(args))
    measure_floors_and_ray(result, args)
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for key, value in result.items():
            print(f"{key:<{width}}  {value}")
    return 0
