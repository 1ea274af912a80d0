"""SGLang's colocated weight payload (`slime.utils.tensor_payload`): the flattened-bucket layout,
the restricted decoder, and a payload crossing to an unrelated process (CPU shared memory; CUDA
IPC where a GPU is present)."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slime.utils import tensor_payload
from slime.utils.tensor_payload import (
    FlattenedTensorMetadata,
    decode_named_tensors,
    deserialize,
    flatten_bucket,
    reconstruct_tensors,
    serialize,
    serialize_flattened_bucket,
    use_file_system_sharing,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_flatten_layout_is_sglangs_and_aligns_odd_offsets():
    named = [("a", torch.ones(3, dtype=torch.bfloat16)), ("b", torch.ones(3, dtype=torch.int8)),
             ("c", torch.tensor(2.0)), ("d", torch.arange(6).reshape(2, 3).t())]
    flat, meta = flatten_bucket(named)
    assert flat.dtype == torch.uint8 and flat.dim() == 1
    # bytes back to back (SGLang's layout); fp32 "c" after 9 bytes moves to 12 (view needs alignment)
    assert [(m.start_idx, m.end_idx, m.numel) for m in meta] == [(0, 6, 6), (6, 9, 3), (12, 16, 4), (16, 64, 48)]
    assert [(m.shape, m.dtype) for m in meta] == [(t.shape, t.dtype) for _, t in named]
    for (name, got), (_, want) in zip(reconstruct_tensors(flat, meta), named):
        assert got.shape == want.shape and torch.equal(_bits(got), _bits(want)), name


def test_reconstruct_refuses_metadata_that_does_not_fit():
    flat, meta = flatten_bucket([("a", torch.ones(4))])
    with pytest.raises(ValueError, match="does not fit"):
        reconstruct_tensors(flat, [FlattenedTensorMetadata("a", torch.Size([5]), torch.float32, 0, 16, 16)])
    with pytest.raises(ValueError, match="does not fit"):
        reconstruct_tensors(flat[:8], meta)


def test_metadata_pickles_under_sglangs_class_name():
    use_file_system_sharing()
    entry, _keep = serialize_flattened_bucket([("a", torch.ones(2))])
    import base64

    raw = base64.b64decode(entry)
    assert b"sglang.srt.weight_sync.tensor_bucket" in raw and b"FlattenedTensorMetadata" in raw
    assert b"slime" not in raw


def test_decoder_refuses_other_globals_and_formats():
    with pytest.raises(pickle.UnpicklingError, match="refused global posix.system"):
        deserialize(serialize([os.system]))
    with pytest.raises(ValueError, match="load_format 'direct'"):
        decode_named_tensors(serialize([("a", torch.ones(1))]), "direct")
    with pytest.raises(ValueError, match="flattened_tensor and metadata"):
        decode_named_tensors(serialize({"x": 1}), "flattened_bucket")
    with pytest.raises(ValueError, match="base64"):
        decode_named_tensors("%%%", None)


SENDER = r"""
import sys, torch
from slime.utils.tensor_payload import serialize_flattened_bucket, use_file_system_sharing
use_file_system_sharing()
device = sys.argv[2]
gen = torch.Generator().manual_seed(1)
named = [("w", torch.randn(5, 3, generator=gen).to(torch.bfloat16).to(device)), ("s", torch.tensor(7.5, device=device)),
         ("i", torch.randint(0, 9, (3,), generator=gen, dtype=torch.int8).to(device))]
entry, keep = serialize_flattened_bucket(named)
torch.save({"entry": entry, "want": [(n, t.cpu()) for n, t in named]}, sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
"""


def _round_trip(tmp_path, device: str):
    """Decode, in this process, a payload that a live unrelated sender process made on `device`."""
    out = tmp_path / "payload.pt"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SENDER, str(out), device], cwd=REPO_ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        saved = torch.load(out)
        got = decode_named_tensors(saved["entry"], "flattened_bucket")
        assert [n for n, _ in got] == [n for n, _ in saved["want"]]
        for (name, g), (_, w) in zip(got, saved["want"]):
            assert g.device.type == device and torch.equal(_bits(g.cpu()), _bits(w)), name
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=60)


def test_cpu_payload_crosses_to_an_unrelated_process(tmp_path):
    _round_trip(tmp_path, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ipc_payload_crosses_to_an_unrelated_process(tmp_path):
    _round_trip(tmp_path, "cuda")


def test_an_unpadded_bucket_goes_in_decreasing_element_size_and_its_receiver_layout_matches():
    """The distributed update's flattened bucket announces names, dtypes and shapes only: the
    receiver places each tensor right after the previous one, so no tensor may need padding."""
    gen = torch.Generator().manual_seed(0)
    named = [("fp8", torch.randn(3, generator=gen).to(torch.float8_e4m3fn)),
             ("bf16", torch.randn(5, generator=gen).to(torch.bfloat16)),
             ("fp32", torch.randn(2, 3, generator=gen)),
             ("u8", torch.randint(0, 255, (7,), generator=gen, dtype=torch.uint8)),
             ("i64", torch.randint(-9, 9, (3,), generator=gen, dtype=torch.int64)),
             ("fp16", torch.randn(1, generator=gen).to(torch.float16))]
    flattened, metadata = tensor_payload.flatten_unpadded(named)
    assert [m.name for m in metadata] == ["i64", "fp32", "bf16", "fp16", "fp8", "u8"]  # stable within a size
    ranges, total = tensor_payload.unpadded_layout([m.dtype for m in metadata], [m.shape for m in metadata])
    assert total == flattened.numel() and ranges == [(m.start_idx, m.end_idx) for m in metadata]
    sent = dict(named)
    for name, tensor in tensor_payload.reconstruct_tensors(flattened, metadata):
        assert tensor.dtype == sent[name].dtype and torch.equal(tensor.view(torch.uint8), sent[name].view(torch.uint8))
