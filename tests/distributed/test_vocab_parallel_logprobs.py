"""Vocab-parallel log-probs and entropy on 2 gloo ranks equal the single-rank values, and their
gradients equal the matching slice of the single-rank gradient."""

import os

import pytest
import torch
import torch.distributed as dist

from slime.backends.megatron_utils.logprobs import vocab_parallel_log_probs
from slime.utils.misc import free_port
from tests.spawn_ranks import spawn_ranks

pytestmark = pytest.mark.distributed


def _worker(rank, world, port, logits, targets, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    shard = logits.chunk(world, dim=-1)[rank].clone().requires_grad_(True)
    lp, ent = vocab_parallel_log_probs(shard, targets, tp_group=dist.group.WORLD, temperature=0.9, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
    torch.save({"lp": lp.detach(), "ent": ent.detach(), "grad": shard.grad}, f"{out_dir}/r{rank}.pt")
    dist.destroy_process_group()


def test_two_rank_vocab_parallel_matches_single_rank(tmp_path):
    torch.manual_seed(0)
    logits = torch.randn(6, 16)
    targets = torch.tensor([0, 7, 8, 15, 3, 12])
    spawn_ranks(_worker, args=(2, free_port(), logits, targets, str(tmp_path)), nprocs=2, join=True)
    full = logits.clone().requires_grad_(True)
    lp, ent = vocab_parallel_log_probs(full, targets, temperature=0.9, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
    shards = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    for s in shards:
        assert torch.allclose(s["lp"], lp.detach(), atol=1e-6)
        assert torch.allclose(s["ent"], ent.detach(), atol=1e-6)
    assert torch.allclose(torch.cat([s["grad"] for s in shards], dim=-1), full.grad, atol=1e-6)
