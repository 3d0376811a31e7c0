"""`dynarl bench hosts`: channel and tensor throughput between two ranks on one host
and across a network link, side by side in one run.

    loopback    a single-host job (the local launcher): payloads over a Unix socket,
                process groups on 127.0.0.1
    same host   two ranks of a two-node job on one node (launch/netns.py's host 0):
                the node's own address, no link crossed
    veth link   one rank on each node: every byte crosses two veth pairs and a bridge

For each: 1 MB channel items from rank 0 to rank 1 (the payload data plane: the
bytes go peer to peer, the controller routes the refs), 100 MB tensors over the
runtime process group (gloo send/recv: P2P resharding's transport) and the weight
sync of a 100 MB model (components/weight_sync.py: a broadcast per bucket of
trainer.sync_bucket_bytes, 1 MB by default). The two-node job runs under torchrun in network namespaces: root only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

from dynarl.components.workflows.config import TrainerSection
from dynarl.core.controller import Controller
from dynarl.components.probe import ProbeWorker

P2P_MB = 100
SYNC_BUCKET_BYTES = TrainerSection().sync_bucket_bytes


async def pair_throughput(ctl: Controller, devices: list[int] | None, mb_items: int, p2p_repeats: int) -> dict:
    """Channel MB/s (1 MB items), gloo tensor and weight-sync MB/s from rank 0 to rank 1 of a
    ProbeWorker pair on `devices` (None: two ranks where the launcher puts them)."""
    workers = await (ctl.spawn(ProbeWorker, devices=devices) if devices else ctl.spawn(ProbeWorker, num_ranks=2))
    try:
        consumed, _ = await asyncio.gather(workers.on([1]).call(ProbeWorker.consume, "large", mb_items, 8),
                                           workers.on([0]).call(ProbeWorker.produce, "large", mb_items, 1 << 20))
        await ctl.process_group("bench", [workers])
        numel = P2P_MB * (1 << 20) // 4
        times, _ = await asyncio.gather(workers.on([1]).call(ProbeWorker.p2p_recv, "bench", numel, p2p_repeats),
                                        workers.on([0]).call(ProbeWorker.p2p_send, "bench", numel, p2p_repeats))
        synced, _ = await asyncio.gather(
            workers.on([1]).call(ProbeWorker.weights_receive, "bench", P2P_MB, p2p_repeats, SYNC_BUCKET_BYTES),
            workers.on([0]).call(ProbeWorker.weights_send, "bench", P2P_MB, p2p_repeats, SYNC_BUCKET_BYTES))
        await ctl.process_groups.destroy("bench")
        return {"channel_mb_per_s": round(consumed[0]["bytes"] / (1 << 20) / consumed[0]["seconds"]),
                "tensor_mb_per_s": round(P2P_MB / statistics.median(times[0])),
                "weight_sync_mb_per_s": round(P2P_MB / statistics.median(synced[0])),
                "nodes": [h.spec.node for h in workers.handles]}
    finally:
        await ctl.stop_group(workers)


async def two_nodes(ctl: Controller, out: str, mb_items: int, p2p_repeats: int) -> str:
    """The workflow of the two-node job: a pair on node 0, then a pair across the nodes."""
    result = {"same_host": await pair_throughput(ctl, [0, 1], mb_items, p2p_repeats),
              "veth_link": await pair_throughput(ctl, [1, 2], mb_items, p2p_repeats)}
    with open(out, "w") as f:
        json.dump(result, f)
    return "ok"


async def loopback(mb_items: int, p2p_repeats: int) -> dict:
    from dynarl.core.config import RuntimeConfig
    async with Controller(RuntimeConfig(launcher="local")) as ctl:
        return await pair_throughput(ctl, None, mb_items, p2p_repeats)


def across_namespaces(mb_items: int, p2p_repeats: int, timeout_s: float) -> dict:
    from dynarl.launch import netns
    why = netns.can_make_namespaces()
    if why is not None:
        raise SystemExit(f"dynarl bench hosts: {why}")
    with tempfile.TemporaryDirectory(prefix="dynarl-bench-hosts-") as tmp, netns.Hosts(2) as hosts:
        out = os.path.join(tmp, "result.json")
        config = os.path.join(tmp, "job.yaml")
        with open(config, "w") as f:
            json.dump({"runtime": {"launcher": "agent", "bind_host": hosts.addr[0],
                                   "cluster": {"num_nodes": 2, "devices_per_node": 2}},
                       "workflow": "dynarl.launch.bench.hosts:two_nodes",
                       "workflow_kwargs": {"out": out, "mb_items": mb_items, "p2p_repeats": p2p_repeats}}, f)
        logs = [os.path.join(tmp, f"node{k}.log") for k in range(2)]
        secret = os.path.join(tmp, "secret")
        netns.secret_file(secret)
        procs = hosts.agents(2, [config], env=dict(os.environ), cwd=tmp, logs=logs, secret=secret)
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        if [p.poll() for p in procs] != [0, 0] or not os.path.exists(out):
            with open(logs[0]) as f:
                raise SystemExit(f"dynarl bench hosts: the two-node job failed:\n{f.read()[-3000:]}")
        with open(out) as f:
            return json.load(f)


def _progress(message: str) -> None:
    print(f"[bench hosts] {message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench hosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--mb-items", type=int, default=300, help="1 MB channel items per pair")
    parser.add_argument("--p2p-repeats", type=int, default=5, help="100 MB tensors, and weight syncs, per pair")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="bound on the two-node job")
    args = parser.parse_args(argv)
    import uvloop
    _progress("loopback: a single-host pair")
    result = {"loopback": uvloop.run(loopback(args.mb_items, args.p2p_repeats))}
    _progress("two nodes in network namespaces: a pair on one node, then a pair across the link")
    result |= across_namespaces(args.mb_items, args.p2p_repeats, args.timeout_s)
    for key in ("channel_mb_per_s", "tensor_mb_per_s", "weight_sync_mb_per_s"):
        result[f"{key}_veth_vs_loopback"] = round(result["veth_link"][key] / result["loopback"][key], 2)
    if args.json:
        print(json.dumps(result))
    else:
        for where in ("loopback", "same_host", "veth_link"):
            r = result[where]
            print(f"{where:<10}  channel {r['channel_mb_per_s']:>6} MB/s   tensor {r['tensor_mb_per_s']:>6} MB/s   "
                  f"weight sync {r['weight_sync_mb_per_s']:>6} MB/s   ranks on nodes {r['nodes']}")
        print(f"veth/loopback: channel {result['channel_mb_per_s_veth_vs_loopback']}x, "
              f"tensor {result['tensor_mb_per_s_veth_vs_loopback']}x, "
              f"weight sync {result['weight_sync_mb_per_s_veth_vs_loopback']}x")
    return 0
