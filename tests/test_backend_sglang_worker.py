NUM_GPUS = 0
"""The GRPO RolloutWorker with rollout.backend=sglang, built through engine_factory.
sglang cannot run here (CUDA): `sglang.Engine` is tests/fakes/sglang_engine.py's fake,
which keeps sglang 0.5.23's signatures and its idle/paused preconditions, and the IPC
serializer (the process boundary) is replaced by an in-memory one. The worker, the
adapter, weight_sync and a real gloo process group are the product code under test.
What a real SGLang engine does on a GPU is not checked here."""
import asyncio
import sys
import threading

import pytest
import torch

from dynarl.components import weight_sync
from dynarl.components.experience import END
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.rollout.sglang import engine as sglang_engine
from dynarl.components.model.spec import ModelSpec
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.sglang.config import SGLangConfig, for_device
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.trainer.base import bucket_by_bytes
from dynarl.transport.process_group import join_group, leave_group
from dynarl.components.experience import PromptGroup, Sample
from fakes.sglang_engine import FakeEngine, FakeTokenizerManager
from fakes.sglang_harness import Payloads, expected, fake_sglang  # noqa: F401  (fixture)

MODEL = ModelSpec(name="tiny-0.5m")
SGLANG = {"model_path": "/models/tiny", "abort_retry_s": 0.01, "mem_fraction_static": 0.5,
          "weight_bucket_bytes": 1 << 18}


@pytest.fixture
def worker(fake_sglang, monkeypatch):
    made = {}
    payloads = Payloads()

    def engine(**kwargs):  # stands in for sglang.Engine(**server args)
        made["kwargs"] = kwargs
        made["tm"] = FakeTokenizerManager(max_total_num_tokens=512, decode=payloads.decode,
                                          tp_size=kwargs["tp_size"])
        made["engine"] = FakeEngine(made["tm"])
        return made["engine"]

    monkeypatch.setattr(sys.modules["sglang"], "Engine", engine, raising=False)
    # the fake package has no import spec for find_spec; the extra check is tested elsewhere
    monkeypatch.setattr(sglang_engine, "require_extra", lambda *args: None)
    # built here, not by the runtime (which binds a rank's device before __init__): a CPU rank
    monkeypatch.setattr(RolloutWorker, "device_kind", "cpu", raising=False)
    workers = []

    def build(**init):
        w = RolloutWorker(MODEL, NativeEngineConfig(), bucket_bytes=1 << 16, backend="sglang",
                          backend_config=SGLangConfig(**SGLANG), **init)
        w.engine._encode = payloads.encode  # SGLang's CUDA-IPC serializer: the process boundary
        workers.append(w)
        return w, made

    yield build
    for w in workers:
        w.engine.shutdown()  # the fake's TokenizerManager task


async def test_the_worker_starts_sglang_with_the_configured_server_args(worker):
    w, made = worker()
    # a CPU rank: SGLang's CPU engine settings, serving the model's dtype there (float32)
    assert made["kwargs"] == for_device(SGLangConfig(**SGLANG), "cpu", "float32").engine_kwargs()
    assert made["kwargs"]["device"] == "cpu" and made["kwargs"]["enable_memory_saver"] is False
    assert made["kwargs"]["skip_tokenizer_init"] is True and w.engine.weight_version == -1
    await w.teardown()
    assert made["engine"].shut_down


async def test_device_lock_frees_the_kv_cache_and_keeps_the_weights(worker):
    w, made = worker(shares_device=True)
    await w.setup()
    assert made["tm"].released == {"kv_cache", "cuda_graph"}
    await w.onload()
    assert made["tm"].released == set()
    await w.offload()
    assert "weights" not in made["tm"].released


class _Inbox:
    def __init__(self, items):
        self.items = list(items)

    async def get(self):
        await asyncio.sleep(0)
        return self.items.pop(0)


class _Outbox:
    def __init__(self):
        self.chunks = []

    async def put(self, chunk, weight, made_of=None):
        self.chunks.append((chunk, weight))

    async def flush(self):
        pass


async def test_generate_emits_groups_sampled_by_sglang(worker):
    w, made = worker()
    prompts = {0: [5, 6, 7], 1: [11, 12]}
    groups = [PromptGroup(i, f"g{i}", "", p, [Sample(f"g{i}s{k}", k) for k in range(2)]) for i, p in prompts.items()]
    inbox, outbox = _Inbox([*groups, END]), _Outbox()
    w.channel = {"prompts": inbox, "out": outbox}.__getitem__  # the runtime's channels
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6}
    counters = await w.generate("prompts", "out", version=-1, chunk_size=1, sampling=sampling)
    assert counters.groups == 2 and counters.tokens == 2 * 2 * 6
    emitted = [g for chunk, _ in outbox.chunks for g in chunk]
    assert sorted(g.index for g in emitted) == [0, 1]
    for group in emitted:
        ids, lps, reason = expected(prompts[group.index], 6)
        for sample in group.samples:
            assert (sample.output_ids, sample.finish, sample.version) == (ids, reason, -1)
            assert sample.logprobs == pytest.approx(lps)
    assert len(made["tm"].received) == 4


async def test_receive_weights_pushes_the_trainers_broadcast_into_sglang(worker):
    """The trainer side (rank 0) broadcasts the native model's buckets over a real gloo
    group; the sglang rank plans them from its meta template and pushes them."""
    w, made = worker()
    source = Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"])
    buckets = list(bucket_by_bytes(((n, p.detach()) for n, p in source.named_parameters()), w.bucket_bytes))
    assert len(buckets) > 1
    store = torch.distributed.HashStore()
    members = [None, None]

    def join(rank):
        members[rank] = join_group("sync", "dynarl/sync/0/", rank, 2, "127.0.0.1", 0, "gloo", 30.0, store=store,
                                    secret=b"k" * 32)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    w.process_group = lambda name: members[1].group
    sender = threading.Thread(target=weight_sync.send, args=(members[0].group, *weight_sync.unbucket(buckets), 3))
    sender.start()
    try:
        assert await w.receive_weights("sync", 3) == 3
    finally:
        sender.join(30)
        for m in members:
            leave_group(m)
    assert w.engine.weight_version == 3 and made["tm"].weight_version == "3"
    pushed = made["tm"].weights
    assert list(pushed) == [n for n, _ in source.named_parameters()]
    assert all(torch.equal(pushed[n], p.detach()) for n, p in source.named_parameters())
    assert not made["tm"].is_pause  # paused for the push, resumed after
    # 2 MB of weights reach SGLang as they arrive: each sync bucket (the worker's bucket_bytes)
    # pushed on its own, none over weight_bucket_bytes (256 KiB), never the model in one piece
    sync_buckets = len(buckets)
    assert len(made["tm"].update_calls) == sync_buckets > 1
