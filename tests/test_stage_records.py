"""The workers' results cross the wire as registered records, not dicts: the stage
results (components/stage_results.py, a streaming trainer's among them), a run's
unfinished work (run_control.py Unfinished), a tool's answer, the embodied learners'
and the trainer's metrics, and a trainer rank's resharding results
(core/migration/reshard_records.py); a record of the wrong shape from an
authenticated peer is rejected as malformed."""
NUM_GPUS = 0

import msgpack
import pytest
import torch

from dynarl.components.embodied.emulated import EmulatedTrainMetrics
from dynarl.components.embodied.learn import PPOMetrics
from dynarl.components.experience import PromptGroup, Sample, Trained
from dynarl.components.rollout.base import GenerationRequest, InflightRequest, SamplingParams
from dynarl.components.rollout.run_control import Unfinished
from dynarl.components.stage_results import InferenceStats, RewardStats, RolloutStats, TrainerStats
from dynarl.components.tools.outcome import ToolResult
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.core.migration.reshard_records import (BoxDigest, BoxLayout, FullState, RangeDigest, RangeLayout)
from dynarl.transport.wire import MAC_HMAC, MAGIC, PROTOCOL_VERSION, Codec, WireError, encode_blob

codec = Codec(b"s" * 32, max_message_bytes=1 << 20)

REQUEST = InflightRequest(GenerationRequest("g/1", [1, 2], SamplingParams(max_new_tokens=8, stop_token_ids=(2,)),
                                            tool_count=1), [5, 6], [-0.5, -0.25])
METRICS = TrainMetrics(loss=0.5, grad_norm=float("inf"), tokens=40, step=3, kl=0.01, update_skipped=True)
TRAINED = Trained(ids=["g/1", "g/2"], digests=[7, 9], rewards=[1.0, 0.0], lengths=[5, 3],
                  finishes=["stop", "length"], versions=[2, 2])
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
    METRICS,
    TRAINED,
    TrainerStats(metrics=METRICS, busy=[[1.0, 2.5]], trained=TRAINED),
    TrainerStats(metrics=METRICS, busy=[], trained=Trained()),  # a rank that got no chunk
    RangeLayout(total_numel=10, ranges={"master": [[0, 5], [5, 10]], "grad": [[0, 5], [5, 10]]}),
    BoxLayout(total_numel=12, layout={"params": [["w", [3, 4], "float32", 0]], "world_size": 1},
              kinds=["exp_avg", "param"], scalars={"adam_step": 3}),
    RangeDigest(range=[5, 10], step=3, sums={"master": 5.0}),
    BoxDigest(owned=6, step=3, sums={"param": 1.5, "exp_avg": 0}, scalars={"adam_step": 3}),
    FullState(step=3, state={"master": {"start": 0, "end": 5, "numel": 5, "nbytes": 20}}, range=[0, 5]),
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
    (TrainMetrics, [0.5, "x", 40, 3, 0.0, 0.0, 0.0, 0.0, 0.0, False, 0.0]),  # a field that is no number
    (TrainMetrics, [0.5, 1.0, 40]),
    (TrainerStats, [None, []]),
    (Trained, [["g/1"], [7], [1.0], [5], ["stop"]]),
    (RangeLayout, [10, {"master": [[0, 5, 7]]}]),                   # a range of three ends
    (RangeLayout, [-1, {}]),
    (BoxLayout, [12, "a layout", [], {}]),
    (RangeDigest, [[10, 5], 3, {}]),                                  # it ends before it starts
    (BoxDigest, ["six", 3, {}, {}]),
    (FullState, [3, {}, [1]]),
])
def test_a_record_of_the_wrong_shape_is_malformed(cls, fields):
    code = msgpack.unpackb(encode_blob(SAMPLE[cls]).body).code  # the ext code the class is registered under
    body = msgpack.packb([msgpack.ExtType(code, msgpack.packb(fields))])
    with pytest.raises(WireError, match=f"bad {cls.__name__}") as info:
        codec.decode(_authenticated(body))
    assert info.value.reason == "malformed"


def test_a_full_state_carries_its_tensors_bitwise():
    """A boxes rank's whole shard: its tensors come back with their dtype and shape, bit
    for bit (bfloat16 too: a uint8 view on the wire)."""
    state = {"param/w": torch.randn(3, 4, dtype=torch.bfloat16), "exp_avg/w": torch.randn(3, 4),
             "adam_step": torch.tensor([3]), "param/empty": torch.empty(0, 4)}
    [got] = codec.decode(codec.encode([FullState(step=3, state=state)]))
    assert type(got) is FullState and got.step == 3 and got.range is None and got.state.keys() == state.keys()
    for key, tensor in state.items():
        assert got.state[key].dtype == tensor.dtype and torch.equal(got.state[key], tensor), key
