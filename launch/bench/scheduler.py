"""`dynarl bench scheduler`: the dynarl policy's decision time on synthetic
snapshots at 128, 1024 and 4096 devices, and P2P reshard bandwidth against plain
gloo send/recv of the same bytes, in the same run."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

from dynarl.core.config import ClusterConfig, RuntimeConfig
from dynarl.core.controller import Controller
from dynarl.core.migration.p2p import p2p_migrate
from dynarl.core.scheduler.policy import ComponentView, DynarlConfig, ClusterView, decide_dynarl
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel


def synthetic(devices: int, rng: random.Random) -> tuple[ClusterView, Predictor]:
    """A math-RL step in its long tail: half the devices on rollout (TP1), most engines
    idle with a few long requests left; trainer (DP units of 8) and inference have work."""
    rollout = devices // 2
    low = int(rollout * rng.uniform(0.82, 0.97))
    lows = tuple([rng.uniform(0.0, 5.0)] * low + [None] * (rollout - low))
    predictor = Predictor({
        "rollout": ThroughputModel([(1, 2_000.0), (rollout, 2_000.0 * rollout)]),
        "trainer": ThroughputModel([(8, 8_000.0), (devices, 950.0 * devices)]),
        "inference": ThroughputModel([(1, 6_000.0), (devices, 6_000.0 * devices)]),
    })
    components = (
        ComponentView("rollout", "dynamic", rollout, rng.uniform(1e5, 1e6),
                      active_requests=max(1, rollout - low - rng.randint(0, 3)), engine_low_since=lows),
        ComponentView("trainer", "static", devices // 4, rng.uniform(1e7, 5e7), devices_per_engine=8),
        ComponentView("inference", "static", devices // 4, rng.uniform(1e6, 5e6)),
    )
    return ClusterView(10.0, components), predictor


def decision_times(devices: int, count: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    config = DynarlConfig()
    times = []
    for _ in range(count):
        snapshot, predictor = synthetic(devices, rng)
        start = time.perf_counter()
        decide_dynarl(snapshot, predictor, config)
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times)


async def reshard_bandwidth(model: str) -> dict:
    """The trainer's own ranks (components/trainer/worker.py) reshard DP 2 -> 1 by P2P,
    beside the same bytes by plain send/recv between probe workers (the floor)."""
    from dynarl.components.model.spec import ModelSpec
    from dynarl.components.probe import ProbeWorker
    from dynarl.components.trainer.base import TrainerConfig
    from dynarl.components.trainer.worker import TrainerWorker
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=3))
    init = {"model": ModelSpec(name=model), "engine": TrainerConfig(), "warmup_lr": 1e-3, "bucket_bytes": 1 << 20}
    async with Controller(config) as ctl:
        old = await ctl.spawn(TrainerWorker, name="trainer", devices=[0, 1], init=init)
        await ctl.process_group("trainer_dp", [old])
        total = (await old.call(TrainerWorker.start, "trainer_dp"))[0]
        result = await p2p_migrate(ctl, old, [2], init)
        moved_mb = result.elements_moved * 4 / 2**20
        reshard_s = result.phases["transfer"]
        # The same bytes by plain send/recv: each old rank's range, to one receiver, posted together.
        peers = await ctl.spawn(ProbeWorker, name="raw", devices=[0, 1, 2])
        await ctl.process_group("raw", [peers])
        half = result.elements_moved // 2
        raw = await asyncio.gather(peers.on([2]).call(ProbeWorker.raw_recv, "raw", [0, 1], half),
                                   peers.on([0]).call(ProbeWorker.raw_send, "raw", 2, half),
                                   peers.on([1]).call(ProbeWorker.raw_send, "raw", 2, result.elements_moved - half))
    raw_s = raw[0][0]
    return {"reshard_mb": round(moved_mb, 1), "reshard_params": total,
            "reshard_mb_per_s": round(moved_mb / reshard_s), "raw_gloo_mb_per_s": round(moved_mb / raw_s),
            "reshard_frac_of_raw": round(raw_s / reshard_s, 3),
            "migration_phases_s": {k: round(v, 3) for k, v in result.phases.items()}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench scheduler")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--decisions", type=int, default=300)
    parser.add_argument("--model", default="tiny-4m", help="trainer model for the reshard measurement")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out: dict = {}
    for devices in (128, 1024, 4096):
        times = decision_times(devices, args.decisions, args.seed)
        out[f"decision_ms_p50_{devices}"] = round(times[len(times) // 2], 3)
        out[f"decision_ms_p99_{devices}"] = round(times[min(len(times) - 1, int(0.99 * len(times)))], 3)
        print(f"[bench scheduler] {devices} devices: p99 {out[f'decision_ms_p99_{devices}']} ms",
              file=sys.stderr, flush=True)
    out["decision_ms_p50"] = out["decision_ms_p50_4096"]
    out["decision_ms_p99"] = out["decision_ms_p99_4096"]
    import uvloop
    out.update(uvloop.run(reshard_bandwidth(args.model)))
    print(json.dumps(out) if args.json else "\n".join(f"{k:<28} {v}" for k, v in out.items()))
    return 0
