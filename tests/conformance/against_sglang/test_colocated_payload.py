"""Our colocated weight payload (`slime.utils.tensor_payload`, what `UpdateWeightFromTensor`
sends) decoded by SGLang's own code in an unrelated process gives our tensors back bit for bit.

A sender subprocess (no sglang, no shared multiprocessing authkey) builds each TP rank's
`serialized_named_tensors` entry with `serialize_flattened_bucket` and keeps its tensors alive;
this process decodes the entries as SGLang's engine does: the HTTP body validated into
`UpdateWeightsFromTensorReqInput`, `MultiprocessingSerializer.deserialize` (its safe unpickler)
after `monkey_patch_torch_reductions`, the metadata converted and `FlattenedTensorBucket(...)
.reconstruct_tensors()` as its model runner does for load_format "flattened_bucket".
"""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[3]

# Run in the sender subprocess: argv = out_dir, number of TP ranks. Writes entries.pt (the
# base64 entries) and expected.pt (clones of the tensors), prints "ready", waits for a line.
SENDER = r"""
import sys, torch
from slime.utils.tensor_payload import serialize_flattened_bucket, use_file_system_sharing
use_file_system_sharing()
out, tp = sys.argv[1], int(sys.argv[2])
gen = torch.Generator().manual_seed(0)
def bucket(rank):
    return [(f"model.layers.{rank}.w_bf16", torch.randn(3, 5, 7, generator=gen).to(torch.bfloat16)),
            ("model.scalar", torch.tensor(1.25 + rank)),
            ("model.odd_int8", torch.randint(-100, 100, (13,), generator=gen, dtype=torch.int8)),
            ("model.after_odd.fp32", torch.randn(1, 9, generator=gen)),
            ("model.half", torch.randn(4, 1, 3, generator=gen).half()),
            ("model.long", torch.arange(5, dtype=torch.int64) * (rank + 1)),
            ("model.flags", torch.tensor([True, False, True])),
            ("model.empty", torch.zeros(0, 4)),
            ("model.transposed", torch.randn(6, 4, generator=gen).t())]
buckets = [bucket(r) for r in range(tp)]
made = [serialize_flattened_bucket(b) for b in buckets]
torch.save([m[0] for m in made], f"{out}/entries.pt")
torch.save([[(n, t.clone()) for n, t in b] for b in buckets], f"{out}/expected.pt")
print("ready", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def sender(tmp_path):
    """(entries, expected) from a live sender subprocess holding two TP ranks' buckets."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-c", SENDER, str(tmp_path), "2"], cwd=REPO_ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", "sender subprocess failed"
        yield torch.load(tmp_path / "entries.pt"), torch.load(tmp_path / "expected.pt")
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=60)


def _request_body(entries) -> dict:
    """The JSON body `EngineClient.update_weights_from_tensor` posts (captured, not sent)."""
    from slime.utils.engine_client import EngineClient

    class Capture(EngineClient):
        async def request(self, method, path, payload=None):
            self.sent = (method, path, payload)

    client = Capture("http://127.0.0.1:1")
    asyncio.run(client.update_weights_from_tensor(entries, load_format="flattened_bucket",
                                                  flush_cache=False, weight_version="7"))
    assert client.sent[:2] == ("POST", "/update_weights_from_tensor")
    return client.sent[2]


def _sglang_decode(entry, load_format):
    """What SGLang's TP worker and model runner do with this rank's entry."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket, FlattenedTensorMetadata

    monkey_patch_torch_reductions()
    data = MultiprocessingSerializer.deserialize(entry)
    assert load_format == "flattened_bucket"
    assert set(data) == {"flattened_tensor", "metadata"}
    assert all(type(m) is FlattenedTensorMetadata for m in data["metadata"])  # SGLang's own class
    metadata = [FlattenedTensorMetadata(name=m.name, shape=m.shape, dtype=m.dtype, start_idx=m.start_idx,
                                        end_idx=m.end_idx, numel=m.numel) for m in data["metadata"]]
    return FlattenedTensorBucket(flattened_tensor=data["flattened_tensor"], metadata=metadata).reconstruct_tensors()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)))


def test_our_decoder_reads_what_sglang_serializes(tmp_path):
    """The local engine's decoder reads a payload made by SGLang's own bucket and serializer
    (in this process: CPU tensors pickle to shared memory either way). Runs before the test that
    applies SGLang's `monkey_patch_torch_reductions`: once patched, SGLang's serializer cannot
    pickle CPU tensors (its patch rewrites argument 6 of every tensor reduction, which only CUDA
    reductions have: IndexError, seen with 0.5.23)."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    from slime.utils.tensor_payload import decode_named_tensors, use_file_system_sharing

    use_file_system_sharing()
    named = [("a", torch.randn(2, 3).to(torch.bfloat16)), ("b", torch.tensor(2.0)), ("c", torch.arange(4))]
    bucket = FlattenedTensorBucket(named_tensors=named)
    obj = {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}
    got = decode_named_tensors(MultiprocessingSerializer.serialize(obj, output_str=True), "flattened_bucket")
    assert [n for n, _ in got] == ["a", "b", "c"]
    assert all(_same_bits(g, w) for (_, g), (_, w) in zip(got, named))
    pairs = decode_named_tensors(MultiprocessingSerializer.serialize(named, output_str=True), None)
    assert all(n == m and _same_bits(g, w) for (n, g), (m, w) in zip(pairs, named))


def test_sglang_decodes_our_flattened_bucket_bit_for_bit(sender):
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput

    entries, expected = sender
    body = _request_body(entries)
    req = UpdateWeightsFromTensorReqInput(**body)
    assert (req.load_format, req.flush_cache, req.weight_version) == ("flattened_bucket", False, "7")
    assert len(req.serialized_named_tensors) == 2  # one entry per engine TP rank
    for tp_rank, want in enumerate(expected):  # each rank decodes only its own entry
        got = _sglang_decode(req.serialized_named_tensors[tp_rank], req.load_format)
        assert [n for n, _ in got] == [n for n, _ in want]
        for (name, g), (_, w) in zip(got, want):
            assert _same_bits(g, w), name
        assert got[1][1].dim() == 0 and got[1][1].item() == 1.25 + tp_rank
