NUM_GPUS = 0
"""P2P create-before-destroy resharding of the megatron trainer between spawned
TrainerWorker processes over gloo: data parallel 1 -> 2 -> 1 and tensor parallel
1 -> 2 -> 1 through core/migration/p2p.py, each rank planning its own box copies
(megatron/layout.py plan_copies) for the weights and the optimizer state. With
trainer.megatron.optimizer adamw, and with megatron-core's own DistributedOptimizer
(float32, and bfloat16 with its fp32 main weights), whose state is a flat range of
each parameter per DP rank (the layout's state boxes). After the round trips the
state is bitwise the unmoved one, and the next step is bitwise the step of a trainer
that never moved. Old ranks are parked in a standby pool (their megatron parallel
state torn down) and adopted again by the next move, at another layout.

The workers get tests/megatron_cpu.py's CUDA shims (megatron_cpu_site on their path)."""
import os

import pytest
import torch

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.components.extras import is_available
from dynarl.components.model.spec import ModelSpec
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.core.migration.p2p import p2p_migrate
from dynarl.core.migration.standby import StandbyPool
from conftest import assert_reaped
from test_trainer import make_batch, make_config

pytestmark = pytest.mark.skipif(not is_available("megatron"),
                                reason="megatron-core not installed: pip install 'dynarl[megatron]'")

SITE = os.path.join(os.path.dirname(__file__), "megatron_cpu_site")


@pytest.fixture
def megatron_cpu(monkeypatch):
    monkeypatch.setenv("DYNARL_TEST_MEGATRON_CPU", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(SITE)  # the local launcher hands the controller's path to its workers


OPTIMIZERS = {  # (optimizer, dtype, use_distributed_optimizer)
    "adamw": ("adamw", "float32", False),
    "megatron-distributed": ("megatron", "float32", True),
    "megatron-distributed-bf16": ("megatron", "bfloat16", True),
    "megatron-bf16": ("megatron", "bfloat16", False),  # Float16OptimizerWithFloat16Params: whole state per rank
}


def _init(optimizer: str = "adamw"):
    from dynarl.components.trainer.megatron.config import MegatronConfig
    kind, dtype, distributed = OPTIMIZERS[optimizer]
    return {"model": ModelSpec(name="tiny-0.5m"), "engine": make_config(), "warmup_lr": 1e-3,
            "bucket_bytes": 1 << 20, "backend": "megatron",
            "backend_config": MegatronConfig(tensor_parallel_size=1, dtype=dtype, use_cpu_initialization=True,
                                             use_distributed_optimizer=distributed, optimizer=kind)}


def _equal(a: dict, b: dict) -> list[str]:
    """Keys whose tensors differ (bitwise)."""
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
async def test_dp_and_tp_round_trips_keep_the_state_bitwise(megatron_cpu, optimizer):
    init = _init(optimizer)
    distributed = OPTIMIZERS[optimizer][2]
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=2))
    async with dynarl.Controller(config) as ctl:
        trainer = await ctl.spawn(TrainerWorker, name="trainer", devices=[0], init=init)
        unmoved = await ctl.spawn(TrainerWorker, name="unmoved", devices=[1], init=init)
        await trainer.call(TrainerWorker.start, None)
        await unmoved.call(TrainerWorker.start, None)
        for group in (trainer, unmoved):
            await group.call(TrainerWorker.train, make_batch(31).to_wire())  # moments are not zero
        before = (await trainer.call(TrainerWorker.full_state))[0]
        assert not _equal(before.state, (await unmoved.call(TrainerWorker.full_state))[0].state)
        pool = StandbyPool(ctl, TrainerWorker, "trainer", init)
        pids = list(trainer.pids)

        dp2 = await p2p_migrate(ctl, trainer, [0, 1], init, standby=pool)  # DP 1 -> 2 (replicas)
        halves = await dp2.group.call(TrainerWorker.full_state)
        for half in halves:
            assert half.step == before.step
        if distributed:  # each DP rank holds a flat range of each parameter's state: the two make it whole
            state_keys = [k for k in before.state if k.split("/")[0] in ("exp_avg", "exp_avg_sq", "main_param")]
            assert state_keys
            for key in state_keys:
                assert torch.equal(torch.cat([h.state[key] for h in halves]), before.state[key]), key
        else:
            for replica in halves:
                assert not _equal(replica.state, before.state)
        dp1 = await p2p_migrate(ctl, dp2.group, [0], init, standby=pool)  # back, onto the parked rank
        assert dp1.group.pids == pids  # adopted from the pool: no process started
        after_dp = (await dp1.group.call(TrainerWorker.full_state))[0]
        assert after_dp.step == before.step and not _equal(after_dp.state, before.state)

        tp2 = await p2p_migrate(ctl, dp1.group, [0, 1], init, standby=pool, start={"tensor_parallel_size": 2})
        slices = await tp2.group.call(TrainerWorker.full_state)
        wide = [k for k in before.state if slices[0].state[k].shape != before.state[k].shape]
        assert wide  # the TP=2 ranks hold slices of the sharded weights and their moments
        tp1 = await p2p_migrate(ctl, tp2.group, [0], init, standby=pool, start={"tensor_parallel_size": 1})
        after_tp = (await tp1.group.call(TrainerWorker.full_state))[0]
        assert not _equal(after_tp.state, before.state)

        # and the moved trainer steps as the unmoved one does
        moved_metrics = (await tp1.group.call(TrainerWorker.train, make_batch(32).to_wire()))[0]
        unmoved_metrics = (await unmoved.call(TrainerWorker.train, make_batch(32).to_wire()))[0]
        assert moved_metrics == unmoved_metrics
        assert not _equal((await tp1.group.call(TrainerWorker.full_state))[0].state,
                          (await unmoved.call(TrainerWorker.full_state))[0].state)
        every = [*tp1.group.pids, *unmoved.pids, *pool.group.pids]
    assert_reaped(every)
