"""SGLang's colocated weight-update payload, written and read without importing sglang.

Owns the wire format of `/update_weights_from_tensor` (SGLang's `UpdateWeightsFromTensorReqInput`):
`serialized_named_tensors` holds one base64 string per engine TP rank; each decodes to what
SGLang's `MultiprocessingSerializer.serialize(obj, output_str=True)` makes: a pickle written with
torch's multiprocessing reductions (a CUDA tensor becomes a CUDA IPC handle, a CPU tensor a
shared-memory file name), base64-encoded. With `load_format="flattened_bucket"` obj is

    {"flattened_tensor": 1-D uint8 tensor (every tensor's bytes, in order),
     "metadata": [FlattenedTensorMetadata(name, shape: torch.Size, dtype: torch.dtype,
                                          start_idx, end_idx, numel), ...]}

where `flattened_tensor[start_idx:end_idx].view(dtype).reshape(shape)` is the tensor and
`numel = end_idx - start_idx` counts bytes (SGLang's `FlattenedTensorBucket`). The metadata
objects pickle under SGLang's class name `sglang.srt.weight_sync.tensor_bucket.FlattenedTensorMetadata`
(NEWOBJ + state dict, as pickling SGLang's own dataclass does), so SGLang's receiver rebuilds its
own class. With `load_format=None` obj is a list of `(name, tensor)` pairs.

CUDA tensors carry the device UUID in place of the device index (what SGLang's
`monkey_patch_torch_reductions` sends and expects): the trainer and the engine see different
`CUDA_VISIBLE_DEVICES`, so an index would name the wrong GPU.

CPU tensors need `torch.multiprocessing` sharing strategy "file_system" in the sender
(`use_file_system_sharing`): the default "file_descriptor" strategy pickles a descriptor that the
receiver fetches from the sender's resource sharer, which authenticates with the sender's
multiprocessing authkey; an unrelated process (the engine) fails there with
`AuthenticationError: digest sent was rejected` (seen with sglang 0.5.23). The sender must keep
the tensors alive until the engine answered: the receiver maps the shared memory by name.

Decoding (`deserialize`) uses a restricted unpickler that resolves only the torch rebuild functions,
storage classes, dtypes and the metadata class listed in `_ALLOWED` (SGLang's own
`SafeUnpickler` allowlists exact globals the same way); anything else is refused.

Imports torch only (utils layer).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import pickle

import torch

SGLANG_METADATA_GLOBAL = ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata")
FLATTENED_BUCKET = "flattened_bucket"


@dataclasses.dataclass
class FlattenedTensorMetadata:
    """One tensor of a flattened bucket: bytes `[start_idx, end_idx)` of the buffer, `numel` bytes.

    Field names and order are SGLang's; pickled under SGLang's class name (`SGLANG_METADATA_GLOBAL`)."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def use_file_system_sharing() -> None:
    """Share CPU tensors between processes through named shared-memory files (see module doc:
    the default file-descriptor strategy fails between unrelated processes)."""
    import torch.multiprocessing as mp

    mp.set_sharing_strategy("file_system")


def flatten_bucket(named_tensors) -> tuple[torch.Tensor, list[FlattenedTensorMetadata]]:
    """`[(name, tensor)]` -> (one uint8 buffer on the tensors' device, metadata), SGLang's layout.

    Tensors follow each other byte for byte; a tensor whose start would not be a multiple of its
    element size (only after a tensor of odd byte count, e.g. fp8 next to fp32) starts at the next
    multiple instead, so `view(dtype)` works on the receiver (SGLang reconstructs by start/end).
    """
    named_tensors = list(named_tensors)
    if not named_tensors:
        raise ValueError("cannot flatten an empty bucket")
    parts, metadata, offset = [], [], 0
    device = named_tensors[0][1].device
    for name, tensor in named_tensors:
        flat = tensor.detach().reshape(-1).contiguous().view(torch.uint8)
        pad = -offset % tensor.element_size()
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=device))
            offset += pad
        parts.append(flat.to(device))
        metadata.append(FlattenedTensorMetadata(name, tensor.shape, tensor.dtype, offset,
                                                offset + flat.numel(), flat.numel()))
        offset += flat.numel()
    return torch.cat(parts), metadata


def flatten_unpadded(named_tensors) -> tuple[torch.Tensor, list[FlattenedTensorMetadata]]:
    """`flatten_bucket` for a receiver that places each tensor right after the previous one (the
    distributed update's flattened bucket, whose request carries names, dtypes and shapes only):
    the tensors go in order of decreasing element size, so every start is a multiple of its element
    size without padding (sizes are powers of two). Returns the buffer and the metadata, whose
    order is the one to announce."""
    return flatten_bucket(sorted(named_tensors, key=lambda named: -named[1].element_size()))  # stable sort


def unpadded_layout(dtypes: list[torch.dtype], shapes) -> tuple[list[tuple[int, int]], int]:
    """The receiver's side of `flatten_unpadded`: per tensor its (start, end) byte range, each
    tensor right after the previous one, and the total bytes."""
    ranges, offset = [], 0
    for dtype, shape in zip(dtypes, shapes):
        size = torch.Size(shape).numel() * dtype.itemsize
        ranges.append((offset, offset + size))
        offset += size
    return ranges, offset


def reconstruct_tensors(flattened: torch.Tensor, metadata) -> list[tuple[str, torch.Tensor]]:
    """The `(name, tensor)` views of a flattened bucket; raises ValueError on inconsistent metadata."""
    if flattened.dtype != torch.uint8 or flattened.dim() != 1:
        raise ValueError(f"flattened_tensor must be 1-D uint8, got {flattened.dtype} {tuple(flattened.shape)}")
    out = []
    for meta in metadata:
        shape, dtype = torch.Size(meta.shape), meta.dtype
        size = shape.numel() * dtype.itemsize
        if not (0 <= meta.start_idx and meta.end_idx - meta.start_idx == meta.numel == size
                and meta.end_idx <= flattened.numel()):
            raise ValueError(f"metadata of {meta.name!r} does not fit the buffer: {meta}")
        out.append((meta.name, flattened[meta.start_idx:meta.end_idx].view(dtype).reshape(shape)))
    return out


def _reduce_tensor(tensor: torch.Tensor):
    """torch's multiprocessing reduction; for CUDA tensors the device index becomes the UUID."""
    from torch.multiprocessing import reductions

    rebuild, args = reductions.reduce_tensor(tensor)
    if tensor.is_cuda and isinstance(args[6], int):
        args = (*args[:6], str(torch.cuda.get_device_properties(args[6]).uuid), *args[7:])
    return rebuild, args


class _PayloadPickler(pickle._Pickler):
    """ForkingPickler's reductions (torch registers its own with it) in the pure-Python pickler,
    whose `save_global` can write our metadata class under SGLang's name without importing sglang."""

    def __init__(self, file) -> None:
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)

        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        self.dispatch_table = {**ForkingPickler(io.BytesIO()).dispatch_table, torch.Tensor: _reduce_tensor}

    def save_global(self, obj, name=None):
        if obj is not FlattenedTensorMetadata:
            return super().save_global(obj, name)
        module, qualname = SGLANG_METADATA_GLOBAL
        self.save(module)
        self.save(qualname)
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)


def serialize(obj) -> str:
    """`obj` as SGLang's `MultiprocessingSerializer.serialize(obj, output_str=True)` writes it."""
    buf = io.BytesIO()
    _PayloadPickler(buf).dump(obj)
    return base64.b64encode(buf.getvalue()).decode("utf-8")


def serialize_flattened_bucket(named_tensors) -> tuple[str, dict]:
    """(one `serialized_named_tensors` entry for `load_format="flattened_bucket"`, the object it
    references). Keep the object alive until the engine answered."""
    flattened, metadata = flatten_bucket(named_tensors)
    obj = {"flattened_tensor": flattened, "metadata": metadata}
    return serialize(obj), obj


# ---- decoding ------------------------------------------------------------------------------
def _cuda_index(device) -> int:
    """Local CUDA index of a device given by index or UUID string."""
    if isinstance(device, int):
        return device
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == device:
            return index
    raise pickle.UnpicklingError(f"no visible CUDA device has UUID {device!r}")


def _rebuild_cuda_tensor(*args):
    from torch.multiprocessing import reductions

    return reductions.rebuild_cuda_tensor(*args[:6], _cuda_index(args[6]), *args[7:])


def _allowed() -> dict:
    """(module, name) -> the object the restricted unpickler returns for it."""
    from torch.multiprocessing import reductions

    table = {("torch.multiprocessing.reductions", n): getattr(reductions, n)
             for n in ("rebuild_tensor", "rebuild_typed_storage", "rebuild_storage_filename",
                       "rebuild_storage_empty")}
    table.update({
        ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"): _rebuild_cuda_tensor,
        ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"): _rebuild_cuda_tensor,
        SGLANG_METADATA_GLOBAL: FlattenedTensorMetadata,
        ("torch", "Tensor"): torch.Tensor, ("torch", "Size"): torch.Size,
        ("torch", "UntypedStorage"): torch.UntypedStorage,
        ("torch.storage", "UntypedStorage"): torch.UntypedStorage,
        ("torch.storage", "TypedStorage"): torch.storage.TypedStorage,
    })
    table.update({("torch", n): getattr(torch, n) for n in dir(torch)
                  if isinstance(getattr(torch, n, None), torch.dtype)})
    return table


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals of `_allowed()`; anything else raises `pickle.UnpicklingError`."""

    def __init__(self, file) -> None:
        super().__init__(file)
        self._table = _allowed()

    def find_class(self, module, name):
        if (module, name) not in self._table:
            hint = (" (the sender must use sharing strategy 'file_system')"
                    if name in ("rebuild_storage_fd", "DupFd") else "")
            raise pickle.UnpicklingError(f"refused global {module}.{name} in a weight payload{hint}")
        return self._table[(module, name)]


def deserialize(data: str | bytes):
    """Decode one `serialized_named_tensors` entry (base64 string or raw pickle bytes)."""
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"serialized_named_tensors entry is not base64: {exc}") from exc
    return _RestrictedUnpickler(io.BytesIO(data)).load()


def decode_named_tensors(entry: str | bytes, load_format: str | None) -> list[tuple[str, torch.Tensor]]:
    """`(name, tensor)` pairs of one entry in `load_format` "flattened_bucket" or None (pairs);
    raises ValueError for other formats or malformed payloads."""
    try:
        obj = deserialize(entry)
    except (pickle.UnpicklingError, EOFError, TypeError, RuntimeError) as exc:  # malformed, or memory gone
        raise ValueError(f"cannot decode the payload: {exc}") from exc
    if load_format == FLATTENED_BUCKET:
        if not isinstance(obj, dict) or set(obj) != {"flattened_tensor", "metadata"}:
            raise ValueError("a flattened_bucket payload must be a dict of flattened_tensor and metadata")
        return reconstruct_tensors(obj["flattened_tensor"], obj["metadata"])
    if load_format is None:
        if not isinstance(obj, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str)
                and isinstance(p[1], torch.Tensor) for p in obj):
            raise ValueError("a payload with load_format None must be a list of (name, tensor) pairs")
        return [tuple(p) for p in obj]
    raise ValueError(f"load_format {load_format!r} is not supported; use 'flattened_bucket' or None")
