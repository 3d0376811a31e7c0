"""Fixtures and helpers shared by the SGLang adapter tests: the fake engine wired to
the adapter, with the fake io_struct module standing in for sglang's."""
import asyncio
import itertools
import sys
import types

import pytest

from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.sglang.config import SGLangConfig
from dynarl.components.rollout.sglang.engine import SGLangRolloutEngine

from . import sglang_io_struct as fake_io
from .sglang_engine import FakeEngine, FakeTokenizerManager, next_token


@pytest.fixture
def fake_sglang(monkeypatch):
    """The adapter imports sglang.srt.managers.io_struct; the fake's structs stand in."""
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.io_struct", fake_io)


class Payloads:
    """Stands in for SGLang's IPC serializer: each payload is read once, by one TP rank."""

    def __init__(self) -> None:
        self.store: dict[bytes, list] = {}
        self.count = itertools.count()

    def encode(self, bucket):
        key = f"payload-{next(self.count)}".encode()
        self.store[key] = [(n, t.clone()) for n, t in bucket]
        return key, None

    def decode(self, payload, load_format):
        return self.store.pop(payload)


@pytest.fixture
def make(fake_sglang):
    engines = []

    def build(tm_cls=FakeTokenizerManager, capacity=256, stream_interval=50, **config):
        payloads = Payloads()
        tm = tm_cls(max_total_num_tokens=capacity, decode=payloads.decode, tp_size=config.get("tp_size", 1),
                    force_stream_interval=stream_interval,
                    enable_priority_scheduling=config.get("enable_priority_scheduling", False))
        tm.encode = payloads.encode  # what a trainer process would run (encode_buckets)
        engine = FakeEngine(tm)
        engines.append(engine)
        return SGLangRolloutEngine(engine, SGLangConfig(model_path="fake", abort_retry_s=0.01, **config),
                                   encode_bucket=payloads.encode), tm

    yield build
    for engine in engines:
        engine.shutdown()


def req(rid, prompt, max_new=8, stop=(), tool_count=0):
    return GenerationRequest(rid, list(prompt), SamplingParams(max_new_tokens=max_new, stop_token_ids=stop),
                             tool_count=tool_count)


def expected(prompt, max_new, stop=()):
    """The fake's uninterrupted output for a prompt."""
    ids, lps = [], []
    while len(ids) < max_new:
        token, lp = next_token(list(prompt) + ids)
        ids.append(token)
        lps.append(lp)
        if token in stop:
            return ids, lps, "stop"
    return ids, lps, "length"


async def ticks(n=5):
    for _ in range(n):
        await asyncio.sleep(0)
