"""A stand-in `sglang` package for the worker processes of tests that run `dynarl train`
with rollout.backend=sglang on CPU: on the path (tests put this folder on sys.path; the
local launcher hands the controller's path to its workers), `sglang.Engine(**server
args)` starts tests/fakes' engine, which keeps sglang 0.5.23's signatures and its
idle/paused rules. SGLang's IPC serializer and FlattenedTensorBucket (srt/) keep the
weight payloads in the rollout process, where the adapter encodes and the fake decodes.
FAKE_SGLANG_TICK_S: seconds per decode step (default 0)."""
import os

from fakes.sglang_engine import FakeEngine, FakeTokenizerManager

from .srt.utils import decode


def Engine(**server_args):
    tm = FakeTokenizerManager(max_total_num_tokens=1 << 20, tp_size=server_args["tp_size"], decode=decode,
                              enable_priority_scheduling=server_args["enable_priority_scheduling"],
                              tick_s=float(os.environ.get("FAKE_SGLANG_TICK_S", "0")))
    return FakeEngine(tm)
