"""Packed micro-batches reach the model as PackedSeqParams: each sample's log-probs in a packed
row equal its log-probs run alone, on the local spec (CPU) and under Transformer Engine (GPU).
Plain causal attention over the packed row (what the TE path ran before) does not pass."""

import json
from pathlib import Path

import pytest
import torch

from slime.utils.misc import free_port
from tests.distributed.megatron_harness import build_trainer, fixed_rollout_data
from tests.spawn_ranks import spawn_ranks

pytestmark = pytest.mark.distributed

ATOL = {"local": 1e-5, "transformer_engine": 2e-2}  # TE runs bf16 flash attention
IMPL_FLAGS = {
    "local": [],
    "transformer_engine": ["--transformer-impl", "transformer_engine", "--distributed-backend", "nccl", "--bf16"],
}


def _direct(trainer, data, indices, *, packed: bool, pad_to: int) -> list[list[float]]:
    """Response log-probs of one micro-batch of `indices` from a direct forward: with the
    micro-batch's PackedSeqParams, or plain causal attention over the packed row."""
    from slime.backends.megatron_utils import train_step as ts
    from slime.backends.megatron_utils.packing import packed_seq_params

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    mb = ts.build_micro_batch(data, indices, pad_to=pad_to, device=device)
    model = trainer.state.model[0]
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=mb.packed.tokens, position_ids=mb.packed.position_ids, attention_mask=None,
                       packed_seq_params=packed_seq_params(mb.packed) if packed else None)
        log_probs, _ = ts.response_log_probs(logits, mb, tp_group=None, temperature=1.0, with_entropy=False,
                                             vocab_size=trainer.args.vocab_size)
    return [t.float().cpu().tolist() for t in log_probs.split(mb.packed.response_lengths)]


def _worker(rank: int, world: int, port: int, hf_dir: str, extra: list[str], out: str):
    args, trainer = build_trainer(hf_dir, world, ["--micro-batch-size", "4"] + extra, rank, port)
    data = fixed_rollout_data()
    everyone = list(range(len(data["tokens"])))
    packed = trainer.compute_log_prob(data, everyone)["log_probs"]  # the trainer's own path: one micro-batch
    alone = [trainer.compute_log_prob(data, [i])["log_probs"][i] for i in everyone]
    result = {
        "packed": [packed[i].float().tolist() for i in everyone],
        "alone": [t.float().tolist() for t in alone],
        # a padding segment at the end of the row (pad to a multiple of 8: 29 -> 32 tokens)
        "padded": _direct(trainer, data, everyone, packed=True, pad_to=8),
        "plain_causal": _direct(trainer, data, everyone, packed=False, pad_to=1),
    }
    if rank == 0:
        Path(out).write_text(json.dumps(result))


def _max_diff(a, b) -> float:
    return max((torch.tensor(x) - torch.tensor(y)).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("impl", [
    "local",
    pytest.param("transformer_engine", marks=[pytest.mark.gpu, pytest.mark.te]),
])
def test_packed_log_probs_equal_each_sample_alone(impl, tiny_moe_hf, tmp_path):
    out = tmp_path / "packed.json"
    spawn_ranks(_worker, args=(1, free_port(), str(tiny_moe_hf), IMPL_FLAGS[impl], str(out)), nprocs=1, join=True)
    got = json.loads(out.read_text())
    assert [len(x) for x in got["alone"]] == fixed_rollout_data()["response_lengths"]
    assert _max_diff(got["packed"], got["alone"]) <= ATOL[impl], got
    assert _max_diff(got["padded"], got["alone"]) <= ATOL[impl], got
    # the test can tell: the first sample is unaffected, every later one attends across the border
    assert _max_diff(got["plain_causal"][:1], got["alone"][:1]) <= ATOL[impl]
    for i in range(1, len(got["alone"])):
        assert _max_diff([got["plain_causal"][i]], [got["alone"][i]]) > 20 * ATOL[impl], (i, got)
