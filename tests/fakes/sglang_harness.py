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

    def build(tm_cls=FakeTokenizerManager, capacity=256, stream_interval=50, tick_s=0.0, **config):
        payloads = Payloads()
        tm = tm_cls(max_total_num_tokens=capacity, decode=payloads.decode, tp_size=config.get("tp_size", 1),
                    force_stream_interval=stream_interval, tick_s=tick_s,
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


@pytest.fixture
def sglang_workers(fake_sglang, monkeypatch):
    """Rollout workers built with rollout.backend=sglang get the fake: SGLangRolloutEngine.start
    wraps a FakeEngine made from the server args, with an in-memory Payloads in place of
    SGLang's IPC serializer, a KV of 256 tokens and 2 ms decode steps (so a migration can
    meet requests mid-generation). For workers of the inproc launcher (this process).
    Yields the fake TokenizerManagers made, in order."""
    made, payloads = [], Payloads()

    def start(cls, config, weight_version=0, owned_dir=None):
        kwargs = config.engine_kwargs()
        tm_cls = BrokenAbortTokenizerManager if len(made) in broken_abort else FakeTokenizerManager
        tm = tm_cls(max_total_num_tokens=256, decode=payloads.decode, tp_size=kwargs["tp_size"],
                    enable_priority_scheduling=kwargs["enable_priority_scheduling"], tick_s=0.002)
        made.append(tm)
        return cls(FakeEngine(tm), config, weight_version, encode_bucket=payloads.encode, owned_dir=owned_dir)

    monkeypatch.setattr(SGLangRolloutEngine, "start", classmethod(start))
    yield made
    broken_abort.clear()


broken_abort: set[int] = set()
"""Engines (by the order `sglang_workers` makes them) whose abort-all fails midway."""


class BrokenAbortTokenizerManager(FakeTokenizerManager):
    """Its scheduler takes an abort-all for one request, then the call fails (a
    migration that fails mid-export)."""

    def abort_request(self, rid: str = "", abort_all: bool = False):
        if not abort_all:
            return super().abort_request(rid, abort_all)
        first = (self.running or self.waiting)[:1]
        for req in first:
            self._finish(req, {"type": "abort", "message": "Abort request", "status_code": 499, "err_type": None},
                         visible=req.sent if req in self.waiting else None)
        raise ConnectionError("scheduler unreachable (fault injection)")
