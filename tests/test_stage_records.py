"""The workers' results cross the wire as registered records, not dicts: the stage
results (components/stage_results.py), a run's unfinished work (run_control.py
Unfinished), a tool's answer and the embodied learners' metrics; a record of the
wrong shape from an authenticated peer is rejected as malformed."""
NUM_GPUS = 0

import msgpack
import pytest

from dynarl.components.embodied.emulated import EmulatedTrainMetrics
from dynarl.components.embodied.learn import PPOMetrics
from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.rollout.base import GenerationRequest, InflightRequest, SamplingParams
from dynarl.components.rollout.run_control import Unfinished
from dynarl.components.stage_results import InferenceStats, RewardStats, RolloutStats
from dynarl.components.tools.outcome import ToolResult
from dynarl.transport.wire import MAC_HMAC, MAGIC, PROTOCOL_VERSION, Codec, WireError, encode_blob

codec = Codec(b"s" * 32, max_message_bytes=1 << 20)

REQUEST = InflightRequest(GenerationRequest("g/1", [1, 2], SamplingParams(max_new_tokens=8, stop_token_ids=(2,)),
                                            tool_count=1), [5, 6], [-0.5, -0.25])
RECORDS = [
    RolloutStats(tokens=12, engine_steps=3, busy=[[0.5, 1.0], [2.0, 2.5]], devices=2, groups=1, turn_kv_s=0.25),
    RewardStats(verifier="calc", samples=4, episodes={"episodes": 4, "route_reasons": {"prefix": 2}}),
    InferenceStats(samples=4, tokens=40, busy=[[0.0, 1.5]]),
    Unfinished(id="group/1", weight=3.0, inflight=[REQUEST], version=4, kv=[[16, "a ref"]], node=1,
               group=PromptGroup(1, "p", "7", [1, 2], [Sample("g/1", 3, output_ids=[5], logprobs=[-0.5])])),
    Unfinished(id="e#0", weight=1.0, inflight=[REQUEST]),
    ToolResult(ok=False, stdout="", error="malformed request: code is empty", latency_s=0.01, rejected=True),
    PPOMetrics(pg_loss=0.1, value_loss=0.2, entropy=0.3, approx_kl=0.0, clip_frac=0.5, explained_var=None,
               updates=4.0, action_std=0.7),
    EmulatedTrainMetrics(loss=0.0, sequences=64.0, time_s=1.5),
]
SAMPLE = {type(r): r for r in RECORDS}


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_comes_back_as_itself(record):
    [got] = codec.decode(codec.encode([record]))
    assert type(got) is type(record) and got == record


def _authenticated(body: bytes) -> list[bytes]:
    nonce = b"n" * 16
    return [MAGIC + bytes([PROTOCOL_VERSION, MAC_HMAC]) + nonce + codec._tag(MAC_HMAC, nonce, body, []) + body]


@pytest.mark.parametrize("cls, fields", [
    (RolloutStats, [12, 3]),                                          # too few fields
    (InferenceStats, [4, 40, [], "one more"]),                        # too many
    (RewardStats, [None, 0, {}, "x"]),
    (Unfinished, ["e#0", 1.0, [{"output_token_ids": []}], None, -1, [], None]),  # a request without its fields
    (Unfinished, ["e#0", "heavy", [], None, -1, [], None]),           # a weight that is no number
    (ToolResult, [True]),
])
def test_a_record_of_the_wrong_shape_is_malformed(cls, fields):
    code = msgpack.unpackb(encode_blob(SAMPLE[cls]).body).code  # the ext code the class is registered under
    body = msgpack.packb([msgpack.ExtType(code, msgpack.packb(fields))])
    with pytest.raises(WireError, match=f"bad {cls.__name__}") as info:
        codec.decode(_authenticated(body))
    assert info.value.reason == "malformed"
