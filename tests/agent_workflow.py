"""Workflow run by the two-agent torchrun test."""
import asyncio
import json
import os

from workers import Echo


async def spread(ctl, out):
    group = await ctl.spawn(Echo, devices=[0, 1])
    results = await group.call("hello", 1)
    parents = await group.call("parent")
    nodes = [h.spec.node for h in group.handles]
    with open(out, "w") as f:
        json.dump({"pids": [r["pid"] for r in results], "parents": parents, "nodes": nodes,
                   "agent0": os.getpid()}, f)
    return "ok"


async def spread_then_wait(ctl, out):
    """Writes what `spread` writes, then runs until the controller is killed."""
    await spread(ctl, out)
    await asyncio.Future()
