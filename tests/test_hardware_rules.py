"""What a GPU node enforces, checked on the CPU (issue: the production path,
hardware-correct). Each test stands for one prediction read from the code before the
fix; the e2e runs (test_grpo_modes, test_backend_megatron_train) exercise the same
paths in whole jobs:

1. weight sync sends CPU tensors on an NCCL group    -> every tensor on the rank's device
2. two members of one NCCL group on one GPU           -> collectives between devices only
3. the native engines never leave the CPU             -> built on the rank's device
4. megatron state read while offloaded                -> refused; the worker onloads around reads
6. groups without timeouts, fp32 on the wire          -> every group timed; model.dtype on the wire
"""
import asyncio
import datetime
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from dynarl.components import weight_sync
from dynarl.components.engine_factory import make_inference_engine, make_rollout_engine, make_trainer
from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.model.spec import ModelSpec, build_model
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.residency import Residency, on_device
from dynarl.transport.process_group import host_store, join_group, leave_group


class _Recorded(dist._Work):
    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True


class RecordingGroup(dist.ProcessGroup):
    """Records the device of every tensor broadcast on it; moves nothing (the test is
    about where the sync puts its tensors, under fake CUDA tensors)."""

    def __init__(self) -> None:
        super().__init__(0, 2)
        self.devices: list[str] = []

    def broadcast(self, tensors, opts):
        self.devices += [t.device.type for t in tensors]
        return _Recorded()


def test_1_the_sync_sends_from_the_ranks_device_in_the_models_dtype(monkeypatch):
    # torch's broadcast asks a CUDA tensor's device for its capability: an H100's (9, 0), the
    # one stand-in for the missing GPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    waits = []  # and its stream, which the sender waits on before casting the bucket after next
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(
        synchronize=lambda: waits.append(1)))
    group = RecordingGroup()
    dist.distributed_c10d._world.pg_group_ranks[group] = {0: 0, 1: 1}
    try:
        model = Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"])
        with FakeTensorMode(allow_non_fake_inputs=True):  # the trainer's float32 weights on a fake GPU
            named = [(n, torch.empty(p.shape, device="cuda")) for n, p in model.named_parameters()]
            buckets = [named[:4], named[4:]]
            sent = weight_sync.send(group, *weight_sync.unbucket(buckets), 1, torch.bfloat16, "cuda")
    finally:
        dist.distributed_c10d._world.pg_group_ranks.pop(group)
    assert group.devices == ["cuda"] * 3  # the header and both buckets: nothing from the host
    assert len(waits) == 2  # the host waited for each bucket's broadcast before its buffer could go
    assert sent == 2 * sum(p.numel() for p in model.parameters())  # bf16: two bytes a parameter


def _pair(body, timeout_s=20.0):
    """Two ranks of a gloo group in threads, each running body(rank, group)."""
    store = host_store("127.0.0.1")
    out, errors = {}, []

    def run(rank):
        member = join_group("s", "dynarl/s/0/k", rank, 2, "127.0.0.1", store.port, "gloo", timeout_s,
                            store=store if rank == 0 else None, secret=b"k" * 32)
        try:
            out[rank] = body(rank, member.group)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            leave_group(member)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
    if errors:
        raise errors[0]
    return out


def test_6_bf16_weights_travel_in_half_the_bytes_and_arrive_in_bf16():
    trainer_model = build_model(ModelSpec())  # float32: the trainer's weights
    results, bucket_bytes = {}, 300_000
    for dtype in (torch.float32, torch.bfloat16):
        receiver = build_model(ModelSpec(init_seed=1), dtype=dtype)

        def body(rank, group, receiver=receiver, dtype=dtype):
            if rank == 0:  # the receivers' plan, filled from the trainer's float32 tensors as they come
                plan = weight_sync.model_plan(ModelSpec(), bucket_bytes, dtype)
                return weight_sync.send(group, plan, ((n, p.detach()) for n, p in trainer_model.named_parameters()),
                                        3, dtype)
            loads = []
            version = weight_sync.receive(group, receiver, bucket_bytes, 2, lambda named, v: loads.append((named, v)))
            return version, loads

        out = _pair(body)
        version, loads = out[1]
        # a bucket at a time, the last one carrying the new version (an engine cut off mid-way holds the old)
        assert version == 3 and len(loads) > 1 and [v for _, v in loads] == [2] * (len(loads) - 1) + [3]
        named = [pair for bucket, _ in loads for pair in bucket]
        assert {t.dtype for _, t in named} == {dtype}
        want = dict(trainer_model.named_parameters())
        assert all(torch.equal(t, want[n].detach().to(dtype)) for n, t in named)
        results[dtype] = out[0]
    assert results[torch.bfloat16] * 2 == results[torch.float32]


def test_6_a_receiver_in_another_dtype_is_refused_by_the_fingerprint():
    receiver = build_model(ModelSpec(), dtype=torch.bfloat16)

    def body(rank, group):
        if rank == 0:  # (the receiver refuses after the header: the sender's broadcast then fails)
            with pytest.raises(RuntimeError):
                weight_sync.send(group, *weight_sync.unbucket([list(receiver.named_parameters())]), 1)
            return True
        with pytest.raises(ValueError, match="same dtype"):
            weight_sync.receive(group, receiver, 1 << 30, 0, lambda named, v: None)  # sent float32, held bf16
        return True

    assert _pair(body)[1] is True


def test_6_a_group_gets_its_timeout():
    """A peer that never joins: the rendezvous gives up at the group's timeout, not never."""
    store = host_store("127.0.0.1")
    begun = time.monotonic()
    with pytest.raises(Exception):
        join_group("lonely", "dynarl/lonely/0/k", 0, 2, "127.0.0.1", store.port, "gloo", 1.0, store=store,
                   secret=b"k" * 32)
    assert time.monotonic() - begun < 60  # a hang bound: given up at its 1 s, not never


def test_3_engines_are_built_on_the_ranks_device_in_the_models_dtype():
    spec = ModelSpec(dtype="bfloat16")
    rollout = make_rollout_engine("native", spec, NativeEngineConfig(), device="meta")
    inference = make_inference_engine("native", spec, 4, device="meta")
    for model in (rollout.model, inference.model):
        assert {(p.device.type, p.dtype) for p in model.parameters()} == {("meta", torch.bfloat16)}
    # the trainer keeps float32 weights, on its device too
    trainer = asyncio.run(make_trainer("native", spec, TrainerConfig(), device="meta"))
    assert {(p.device.type, p.dtype) for p in trainer.engine.model.parameters()} == {("meta", torch.float32)}
    # auto: bf16 on a GPU, float32 on a CPU
    assert ModelSpec().engine_dtype("cuda") == torch.bfloat16 and ModelSpec().engine_dtype("cpu") == torch.float32


class _OffloadingEngine:
    """An engine whose reads are refused while offloaded (megatron's rule)."""

    frees_offloaded_state = True

    def __init__(self):
        self.is_onloaded, self.calls = False, []

    async def onload(self):
        self.calls.append("onload")
        self.is_onloaded = True

    async def offload(self):
        self.calls.append("offload")
        self.is_onloaded = False

    def read(self):
        if not self.is_onloaded:
            raise RuntimeError("read while offloaded")
        return "state"


class _Worker(Residency):
    def __init__(self, engine):
        self.trainer = engine

    @on_device
    async def export(self, pause=0.0):
        first = self.trainer.read()
        await asyncio.sleep(pause)  # a read that spans awaits (a broadcast)
        return first, self.trainer.read()


def test_4_reads_outside_the_device_lock_onload_around_them():
    engine = _OffloadingEngine()
    assert asyncio.run(_Worker(engine).export()) == ("state", "state")
    assert engine.calls == ["onload", "offload"] and not engine.is_onloaded  # offloaded again after
    engine.is_onloaded, engine.calls = True, []
    assert asyncio.run(_Worker(engine).export()) == ("state", "state") and engine.calls == []  # resident: untouched
    # an engine whose offloaded state stays readable (native: host memory) is not moved for a read
    engine.is_onloaded, engine.frees_offloaded_state = False, False
    with pytest.raises(RuntimeError, match="while offloaded"):  # (this stand-in still refuses, so it shows)
        asyncio.run(_Worker(engine).export())
    assert engine.calls == []


def test_4_reads_at_once_and_the_device_lock_never_offload_under_a_read():
    async def main():
        engine = _OffloadingEngine()
        worker = _Worker(engine)
        # two reads at once, and the device_lock's onload arriving in the middle of the first
        reads = [asyncio.create_task(worker.export(0.05)), asyncio.create_task(worker.export(0.05))]
        await asyncio.sleep(0.01)
        lock_onload = asyncio.create_task(worker.set_resident(True))
        assert await asyncio.gather(*reads) == [("state", "state")] * 2
        await lock_onload
        return engine

    engine = asyncio.run(main())
    # each read onloaded and offloaded in turn; the lock's onload came after them and stands
    assert engine.calls == ["onload", "offload", "onload", "offload", "onload"] and engine.is_onloaded


def test_4_every_state_read_of_the_trainer_worker_is_on_device():
    """The trainer worker's methods that read the engine outside the device_lock."""
    from dynarl.components.trainer.worker import TrainerWorker

    for name in ("send_weights", "save_checkpoint", "load_checkpoint", "save_model", "reshard_layout",
                 "reshard_send", "reshard_send_boxes", "state_digest", "full_state"):
        assert getattr(TrainerWorker, name).__wrapped__, name  # functools.wraps of on_device
