"""Pushing new weights into a running SGLang engine, bucket by bucket, from the
worker's event loop (sglang 0.5.23, docs/BACKENDS.md A6, B7):

    pause(retract)         running requests go back to the queue, their KV is freed
    begin_weight_update    0.5.23 refuses tensor updates outside such a session;
                           older builds have no session: chosen by feature detection
    update_weights_from_tensor per bucket, flush_cache=False (one flush at the end)
    end_weight_update
    flush_cache            the prefix cache holds KV of the old weights
    continue_generation    (done by the caller, who paused)

Tensors travel as SGLang's own IPC payloads, one per TP rank (each rank reads only
its own): the default encoder uses SGLang's FlattenedTensorBucket and
MultiprocessingSerializer (CUDA IPC handles), so producer and engine share a node.
The encoding must run in the process that owns the tensors: a trainer in another
process encodes its buckets (encode_buckets) and the rollout worker passes the
payloads on (SGLangRolloutEngine.update_weights_from_payloads). The serializer
pickles; the payloads are opaque bytes to dynarl, unpickled only by SGLang's own
scheduler processes (with its restricted unpickler).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

NamedTensors = Sequence[tuple[str, torch.Tensor]]
BucketEncoder = Callable[[NamedTensors], tuple[Any, str | None]]
"""A bucket -> (one payload for one TP rank, load_format)."""


def flattened_bucket_encoder(bucket: NamedTensors) -> tuple[Any, str | None]:
    """SGLang's "flattened_bucket" format: one uint8 buffer and its metadata per bucket."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    flat = FlattenedTensorBucket(named_tensors=list(bucket))
    payload = {"flattened_tensor": flat.get_flattened_tensor(), "metadata": flat.get_metadata()}
    return MultiprocessingSerializer.serialize(payload), "flattened_bucket"


def has_update_session(tokenizer_manager: Any) -> bool:
    """sglang >= 0.5.23 wants begin/end_weight_update around tensor updates."""
    return hasattr(tokenizer_manager, "begin_weight_update")


def _check(result: Any, what: str) -> None:
    success, message = (result.success, result.message) if hasattr(result, "success") else result[:2]
    if not success:
        raise RuntimeError(f"SGLang {what} failed: {message}")


def encode_buckets(buckets: Iterable[NamedTensors], tp_size: int, encode: BucketEncoder
                   ) -> Iterator[tuple[list[Any], str | None]]:
    """Per bucket: one payload per TP rank (each rank owns, and frees, its own copy)."""
    for bucket in buckets:
        if bucket:
            encoded = [encode(bucket) for _ in range(tp_size)]
            yield [payload for payload, _ in encoded], encoded[0][1]


async def push_payloads(tokenizer_manager: Any, io: Any, payloads: Iterable[tuple[list[Any], str | None]],
                        version: int) -> int:
    """Steps 2-5 above on a paused engine, for buckets already encoded (one payload per
    TP rank each). Returns the number of buckets sent. If a step fails after begin, the
    session is closed before the error propagates, so the engine accepts the next attempt."""
    tm = tokenizer_manager
    session = has_update_session(tm)
    if session:
        _check(await tm.begin_weight_update(io.BeginWeightUpdateReqInput(), None), "begin_weight_update")
    sent = 0
    try:
        for per_rank, load_format in payloads:
            request = io.UpdateWeightsFromTensorReqInput(
                serialized_named_tensors=list(per_rank), load_format=load_format, flush_cache=False,
                weight_version=str(version))
            _check(await tm.update_weights_from_tensor(request, None), "update_weights_from_tensor")
            sent += 1
    except BaseException:
        if session:
            await tm.end_weight_update(io.EndWeightUpdateReqInput(), None)
        raise
    if session:
        _check(await tm.end_weight_update(io.EndWeightUpdateReqInput(), None), "end_weight_update")
    _check(await tm.flush_cache(), "flush_cache")
    return sent
