"""Our trainer-side weight-update group and SGLang's own group code form one group (gloo).

This process is rank 0 through `slime.utils.weight_transport.init_weight_update_group` (what
`UpdateWeightFromDistributed.connect` runs); a separate process is the engine, rank 1, joining
with SGLang's model-runner `init_weights_update_group` (its `init_custom_process_group` wraps the
TCP store in a prefix store named after the group) and receiving with its
`/update_weights_from_distributed` code (sglang_group_peer.py). Tensors of several dtypes and
shapes, broadcast in `names` order one by one or as one flattened bucket (our sender's format),
arrive bit for bit (both formats in one test, one peer process for both groups). Before our
store carried SGLang's prefix, the two sides waited on different keys until the timeout.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from slime.utils.misc import free_port
from slime.utils.tensor_payload import FLATTENED_BUCKET, flatten_unpadded
from slime.utils.weight_transport import init_weight_update_group

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
JOIN_TIMEOUT_S = 300  # the peer imports sglang's model runner first (~1 min on a busy machine)


def _bucket() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(6, 4, generator=gen),
        "model.layers.0.mlp.experts.1.up_proj.weight": torch.randn(3, 5, generator=gen).to(torch.bfloat16),
        "model.norm.weight": torch.randn(7, generator=gen).to(torch.float16),
        "lm_head.weight": torch.randn(2, 3, 4, generator=gen).to(torch.float64),
        "model.step": torch.randint(-2**40, 2**40, (3,), generator=gen),
        "model.counts": torch.randint(-1000, 1000, (2, 2), generator=gen, dtype=torch.int32),
        "model.bytes": torch.randint(0, 256, (5,), generator=gen, dtype=torch.uint8),
    }
    return tensors


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


LOAD_FORMATS = (None, FLATTENED_BUCKET)


def _spec(bucket: dict, load_format) -> tuple[dict, dict, list[torch.Tensor]]:
    """(the bucket in the order our sender announces, the group's spec for the peer, the tensors
    broadcast: one per tensor, or the flattened bucket)."""
    sent = [t.clone() for t in bucket.values()]
    if load_format is not None:
        flattened, metadata = flatten_unpadded(bucket.items())
        bucket, sent = {m.name: bucket[m.name] for m in metadata}, [flattened]
    spec = {"master_address": "127.0.0.1", "master_port": free_port("127.0.0.1"), "rank_offset": 1,
            "world_size": 2, "group_name": "slime-weights-pp0", "names": list(bucket),
            "load_format": load_format, "dtypes": [str(t.dtype).removeprefix("torch.") for t in bucket.values()],
            "shapes": [list(t.shape) for t in bucket.values()]}
    return bucket, spec, sent


def test_our_rank0_and_sglangs_helper_broadcast_a_bucket_bit_for_bit(tmp_path):
    """One broadcast per tensor, then (what our sender sends) one of the bucket's bytes laid out
    by `flatten_unpadded`, received by SGLang's FlattenedTensorBucket code of the release: two
    groups in turn with one peer process (its import of SGLang's model runner is most of its time)."""
    cases = [_spec(_bucket(), load_format) for load_format in LOAD_FORMATS]
    args = []
    for i, (_, spec, _) in enumerate(cases):
        (tmp_path / f"spec{i}.json").write_text(json.dumps(spec))
        args += [str(tmp_path / f"spec{i}.json"), str(tmp_path / f"received{i}.pt")]
    log = open(tmp_path / "peer.log", "wb")
    peer = subprocess.Popen([sys.executable, "-m", "tests.conformance.against_sglang.sglang_group_peer", *args],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _, spec, sent in cases:
            group = init_weight_update_group("127.0.0.1", spec["master_port"], 0, 2, spec["group_name"], "gloo",
                                             timeout_s=JOIN_TIMEOUT_S)
            for tensor in sent:
                group.broadcast(tensor, src=0)
            group.destroy()
        assert peer.wait(timeout=JOIN_TIMEOUT_S) == 0, (tmp_path / "peer.log").read_text()[-3000:]
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
        log.close()
    for i, (bucket, spec, _) in enumerate(cases):
        _check_received(torch.load(tmp_path / f"received{i}.pt"), bucket, spec["load_format"])


def _check_received(received: dict, bucket: dict, load_format) -> None:
    assert list(received) == list(bucket), load_format
    for name, sent in bucket.items():
        got = received[name]
        assert got.dtype == sent.dtype and got.shape == sent.shape, (load_format, name)
        assert torch.equal(_bits(got), _bits(sent)), (load_format, name)

