"""SGLang's MultiprocessingSerializer, as a store in this process (the rollout worker's:
the adapter serializes, the fake engine's TokenizerManager decodes)."""
import itertools

from .weight_sync.tensor_bucket import FlattenedTensorBucket

_store: dict[str, object] = {}
_ids = itertools.count()


class MultiprocessingSerializer:
    @staticmethod
    def serialize(obj, output_str: bool = False) -> str:
        key = f"payload-{next(_ids)}"
        _store[key] = obj
        return key


def decode(payload: str, load_format: str | None) -> list:
    obj = _store.pop(payload)
    if load_format == "flattened_bucket":
        return FlattenedTensorBucket(flattened_tensor=obj["flattened_tensor"],
                                     metadata=obj["metadata"]).reconstruct_tensors()
    return list(obj)
