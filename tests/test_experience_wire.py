"""PromptGroup and Sample cross the wire as themselves (transport/wire.py register_struct)."""
NUM_GPUS = 0

import msgpack
import numpy as np
import pytest

from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.rollout.emulated.tokens import LazyList
from dynarl.transport.wire import MAC_HMAC, MAGIC, PROTOCOL_VERSION, Codec, WireError, decode_blob, \
    encode_blob, register_struct

codec = Codec(b"s" * 32, max_message_bytes=1 << 20)


def group() -> PromptGroup:
    done = Sample("p/0", 7, output_ids=[4, 5], logprobs=[-0.5, -1.0], finish="stop", version=3, reward=1.0,
                  advantage=0.5, old_logprobs=[-0.4, -0.9], mask=[1, 1])
    simulated = Sample("p/1", 8, max_new_tokens=2, output_ids=LazyList(2, lambda: [9, 9]))
    scripted = Sample("p/2", 9, turns=[[30, 0.2, 12], [5, 0.0, 0]])
    return PromptGroup(3, "p", "42", np.array([1, 2, 3], dtype=np.int64), [done, simulated, scripted])


def test_groups_round_trip_typed_through_messages_and_blobs():
    sent = group()
    for got in (codec.decode(codec.encode([sent]))[0], decode_blob(encode_blob({"chunk": [sent]}))["chunk"][0]):
        assert isinstance(got, PromptGroup) and all(isinstance(s, Sample) for s in got.samples)
        assert got.index == 3 and got.answer == "42" and got.prompt_ids.tolist() == [1, 2, 3]
        assert got.samples[0] == sent.samples[0]
        assert got.samples[1].output_ids == [9, 9] and got.samples[1].max_new_tokens == 2  # a LazyList goes as a list
        assert got.samples[2].turns == [[30, 0.2, 12], [5, 0.0, 0]] and got.samples[2].version == -1


def _authenticated(body: bytes) -> list[bytes]:
    nonce = b"n" * 16
    return [MAGIC + bytes([PROTOCOL_VERSION, MAC_HMAC]) + nonce + codec._tag(MAC_HMAC, nonce, body, []) + body]


@pytest.mark.parametrize("code, fields, why", [
    (16, ["p/0"], "bad Sample"),                                   # too few fields
    (16, [3, 7] + [None] * 11, "bad Sample"),                      # id not a str
    (17, [0, "p", "", [1], [["not", "a", "sample"]]], "bad PromptGroup"),
    (17, ["zero", "p", "", [1], []], "bad PromptGroup"),
    (99, [], "unknown ext type 99"),
])
def test_malformed_records_from_an_authenticated_peer_are_rejected(code, fields, why):
    body = msgpack.packb([msgpack.ExtType(code, msgpack.packb(fields))])
    with pytest.raises(WireError, match=why) as info:
        codec.decode(_authenticated(body))
    assert info.value.reason == "malformed"


def test_struct_codes_are_checked_at_registration():
    with pytest.raises(ValueError, match="16..127"):
        register_struct(3)
    with pytest.raises(ValueError, match="Sample's"):
        register_struct(16)(type("Other", (), {}))
