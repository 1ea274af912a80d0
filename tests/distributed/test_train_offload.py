"""Trainer memory hand-over (`--offload-train`) on gloo ranks: after offload the parameters, DDP
buffers, grads and optimizer state hold no storage; after onload training continues bit for bit
as without offload (same loss and grad norm, step after step), on one and on two ranks (two with
the distributed optimizer, whose state is sharded)."""

import json
from pathlib import Path

import pytest

from slime.utils.misc import free_port
from tests.distributed.megatron_harness import build_trainer, fixed_rollout_data
from tests.spawn_ranks import spawn_ranks

pytestmark = pytest.mark.distributed

ROLLOUTS = 3


def _storages(trainer) -> dict[str, int]:
    """Bytes held by every parameter, main grad, DDP buffer and optimizer state tensor."""
    from slime.backends.megatron_utils.offload import _ddp_buffers, _optimizer_tensors

    model = trainer.state.model[0]
    held = {"params": sum(p.untyped_storage().nbytes() for p in model.parameters()),
            "main_grads": sum(p.main_grad.untyped_storage().nbytes() for p in model.parameters()
                              if getattr(p, "main_grad", None) is not None),
            "ddp_buffers": sum(t.untyped_storage().nbytes() for b in _ddp_buffers(model)
                               for t in (b.param_data, b.grad_data) if t is not None)}
    state, grads = _optimizer_tensors(trainer.state.optimizer)
    held["optimizer"] = sum(t.untyped_storage().nbytes() for t in state + grads)
    return held


def _worker(rank: int, world: int, port: int, hf_dir: str, extra: list[str], out: str, offload: bool):
    import torch

    from slime.backends.megatron_utils.parallel import destroy_parallel

    torch.manual_seed(0)
    _, trainer = build_trainer(hf_dir, world, extra, rank, port)
    metrics, held = [], []
    for rollout_id in range(ROLLOUTS):
        metrics.append(trainer.train(rollout_id, fixed_rollout_data()))
        if offload:
            before = _storages(trainer)
            trainer.offload(["optimizer", "grads"])
            trainer.offload(["weights"])
            held.append({"before": before, "after": _storages(trainer),
                         "tracked": trainer.memory_held("after_offload")})
            trainer.onload(["weights"])
            trainer.onload(["optimizer", "grads"])
    if rank == 0:
        Path(out).write_text(json.dumps({"metrics": metrics, "held": held}))
    destroy_parallel()


def _run(hf_dir, world, extra, tmp_path, offload):
    out = Path(tmp_path) / f"offload_{offload}.json"
    spawn_ranks(_worker, args=(world, free_port(), str(hf_dir), extra, str(out), offload), nprocs=world, join=True)
    return json.loads(out.read_text())


@pytest.mark.parametrize("world,extra", [(1, []), (2, ["--use-distributed-optimizer"])], ids=["1rank", "2rank-distopt"])
def test_offload_frees_everything_and_training_continues_bit_exactly(world, extra, tiny_moe_hf, tmp_path):
    plain = _run(tiny_moe_hf, world, extra, tmp_path, offload=False)
    moved = _run(tiny_moe_hf, world, extra, tmp_path, offload=True)
    for held in moved["held"]:
        assert all(v > 0 for v in held["before"].values()), held["before"]
        assert held["after"] == {k: 0 for k in held["before"]}, held["after"]
        assert held["tracked"]["perf/train_held_gib_after_offload"] == 0.0
    for step, (want, got) in enumerate(zip(plain["metrics"], moved["metrics"])):
        for key in ("train/loss", "train/grad_norm", "train/pg_loss", "train/ppo_kl"):
            assert got[key] == want[key], f"rollout {step}: {key} {got[key]} != {want[key]} without offload"
