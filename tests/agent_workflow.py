"""Workflows the agent tests run (test_agent.py on one host, test_netns.py across namespaces)."""
import asyncio
import json
import os

from workers import Echo


def two_node_train_config(steps: int = 2, bind_host: str | None = None, runtime_extra: str = "") -> str:
    """A `dynarl train` config for two nodes of two devices under the agent launcher:
    rollout [0] and inference [1] on node 0, the trainer's two ranks [2, 3] on node 1."""
    bind = f"  bind_host: {bind_host}\n" if bind_host else ""
    return f"""
runtime:
  launcher: agent
{bind}{runtime_extra}  cluster: {{num_nodes: 2, devices_per_node: 2}}
placement: {{mode: spatial}}
rollout: {{num_ranks: 1, max_new_tokens: 12, samples_per_prompt: 4, chunk_size: 2}}
inference: {{num_ranks: 1}}
trainer: {{num_ranks: 2, warmup: {{steps: 4, batch_size: 32}}, engine: {{micro_batch_size: 32}}}}
task: {{count_up: {{alphabet: abcdefghij, median_len: 2}}}}
run: {{steps: {steps}, prompts_per_step: 8}}
"""


async def spread(ctl, out):
    group = await ctl.spawn(Echo, devices=[0, 1])
    results = await group.call(Echo.hello, 1)
    parents = await group.call(Echo.parent)
    nodes = [h.spec.node for h in group.handles]
    with open(out, "w") as f:
        json.dump({"pids": [r["pid"] for r in results], "parents": parents, "nodes": nodes,
                   "agent0": os.getpid()}, f)
    return "ok"


async def spread_then_wait(ctl, out):
    """Writes what `spread` writes, then runs until the controller is killed."""
    await spread(ctl, out)
    await asyncio.Future()


async def spread_until(ctl, out, release):
    """Writes what `spread` writes, waits until the file `release` exists, then checks
    that both ranks still answer and adds their answers to `out` as "after"."""
    group = await ctl.spawn(Echo, devices=[0, 1])
    results = await group.call(Echo.hello, 1)
    with open(out + ".tmp", "w") as f:
        json.dump({"pids": [r["pid"] for r in results], "nodes": [h.spec.node for h in group.handles],
                   "controller": ctl.router.address}, f)
    os.replace(out + ".tmp", out)
    while not os.path.exists(release):
        await asyncio.sleep(0.1)
    after = await group.call(Echo.hello, 2)
    with open(out + ".tmp", "w") as f:
        json.dump({"pids": [r["pid"] for r in results], "after": [r["x"] for r in after]}, f)
    os.replace(out + ".tmp", out)
    return "ok"


async def p2p_across_hosts(ctl, out):
    """A 2-rank DP trainer on node 0 reshards by P2P onto node 1's two devices, then onto
    one device of each node (a DP group across the hosts), training a step there; the
    gathered state is compared bitwise with the state before each move."""
    import torch
    from dynarl.core.migration.p2p import p2p_migrate
    from reshard_workers import ReshardTrainer, make_batch

    group = await ctl.spawn(ReshardTrainer, name="trainer", devices=[0, 1])
    await ctl.process_group("trainer_dp", [group])
    await group.call(ReshardTrainer.start, "trainer_dp")
    for step in range(2):
        await group.scatter(ReshardTrainer.train, [[make_batch(step)]] * 2)

    async def gathered(g):  # each tensor joined from the ranks' dim-0 rows (FSDP2), in rank order
        parts = await g.call(ReshardTrainer.full_state)
        keys = [k for k in parts[0].state if "/" in k]
        return {k: torch.cat([p.state[k] for p in parts]) for k in keys}, sorted({p.step for p in parts})

    def equal(a, b):
        return {"equal": {k: bool(torch.equal(a[0][k], b[0][k])) for k in a[0]}, "steps": [a[1], b[1]]}

    before = await gathered(group)
    moves = []
    for devices in ([2, 3], [1, 2]):
        result = await p2p_migrate(ctl, group, devices, {})
        group = result.group
        moves.append({"nodes": [h.spec.node for h in group.handles], "elements": result.elements_moved,
                      **equal(before, await gathered(group))})
    await group.scatter(ReshardTrainer.train, [[make_batch(9)]] * 2)  # it trains on, its DP group across the hosts
    after = await gathered(group)
    with open(out, "w") as f:
        json.dump({"moves": moves, "trained_on": after[1]}, f)
    return "ok"
