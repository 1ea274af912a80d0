"""The skipped old-policy pass (old_policy.py) changes no number: the forward-only pass's log-probs
equal the training forward's bit for bit, and a few rollouts give the same metrics with the pass
skipped as with it run. Tiny MoE, 2 gloo ranks, EP=2, several micro-batches per step."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from slime.utils.misc import free_port
from tests.distributed.megatron_harness import build_trainer, fixed_rollout_data
from tests.spawn_ranks import spawn_ranks

# one step per rollout (4 samples, --global-batch-size 4), 2-3 micro-batches per rank (--max-tokens-per-gpu 16)
FLAGS = ["--expert-model-parallel-size", "2", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "16",
         "--eps-clip", "0.2", "--eps-clip-high", "0.28"]
ROLLOUTS = 3


def _worker(rank: int, world: int, port: int, hf_dir: str, reuse: bool, out: str):
    torch.manual_seed(0)
    args, trainer = build_trainer(hf_dir, world, FLAGS, rank, port)
    trainer.reuse_train_log_probs = reuse
    seen = {"passes": 0, "mbs": 0, "unequal": 0}
    compute_log_prob, compute_loss = trainer.compute_log_prob, trainer._compute_loss

    def counted_pass(*a, **kw):
        seen["passes"] += 1
        return compute_log_prob(*a, **kw)

    def checked_loss(mb, log_probs, entropy, logits):
        seen["mbs"] += 1
        if not reuse:  # the old pass's log-probs against this (training) forward's, bit for bit
            seen["unequal"] += int(not torch.equal(mb.tensors["log_probs"], log_probs.detach()))
        return compute_loss(mb, log_probs, entropy, logits)

    trainer.compute_log_prob, trainer._compute_loss = counted_pass, checked_loss
    metrics = [trainer.train(i, fixed_rollout_data(with_rollout_log_probs=True)) for i in range(ROLLOUTS)]
    one_step = dict(seen)
    args.global_batch_size = 2  # two steps per rollout: the pass is needed again
    trainer.train(ROLLOUTS, fixed_rollout_data(with_rollout_log_probs=True))
    if rank == 0:
        Path(out).write_text(json.dumps({"metrics": metrics, **one_step,
                                         "passes_two_steps": seen["passes"] - one_step["passes"]}))
    from slime.backends.megatron_utils.parallel import destroy_parallel

    destroy_parallel()


def _run(hf_dir, tmp_path, reuse: bool) -> dict:
    out = Path(tmp_path) / f"reuse_{reuse}.json"
    spawn_ranks(_worker, args=(2, free_port(), str(hf_dir), reuse, str(out)), nprocs=2, join=True)
    return json.loads(out.read_text())


def test_skipped_old_pass_changes_no_metric(tiny_moe_hf, tmp_path):
    ran, skipped = _run(tiny_moe_hf, tmp_path, reuse=False), _run(tiny_moe_hf, tmp_path, reuse=True)
    assert ran["mbs"] >= 2 * ROLLOUTS, ran  # several micro-batches per step
    assert ran["unequal"] == 0, f"{ran['unequal']} micro-batches' old log-probs differ from the train forward's"
    assert ran["passes"] == ROLLOUTS and skipped["passes"] == 0, (ran["passes"], skipped["passes"])
    assert skipped["passes_two_steps"] == 1  # two optimizer steps: the pass runs
    for step, (a, b) in enumerate(zip(ran["metrics"], skipped["metrics"])):
        a, b = ({k: v for k, v in m.items() if not k.startswith("perf/")} for m in (a, b))
        assert a == b, (step, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    assert "train/train_rollout_logprob_abs_diff" in ran["metrics"][0]
