"""sglang.srt.weight_sync.tensor_bucket.FlattenedTensorBucket's interface: named tensors
as one flat uint8 buffer and metadata, and back."""
import torch


class FlattenedTensorBucket:
    def __init__(self, named_tensors=None, flattened_tensor=None, metadata=None) -> None:
        if named_tensors is not None:
            parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in named_tensors]
            self.flattened_tensor = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
            self.metadata, offset = [], 0
            for (name, t), part in zip(named_tensors, parts):
                self.metadata.append((name, tuple(t.shape), t.dtype, offset, offset + part.numel()))
                offset += part.numel()
        else:
            self.flattened_tensor, self.metadata = flattened_tensor, metadata

    def get_flattened_tensor(self) -> torch.Tensor:
        return self.flattened_tensor

    def get_metadata(self) -> list:
        return self.metadata

    def reconstruct_tensors(self) -> list:
        return [(name, self.flattened_tensor[start:end].view(dtype).reshape(shape))
                for name, shape, dtype, start, end in self.metadata]
