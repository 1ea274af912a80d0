"""Context parallelism on 2 gloo ranks: each rank holds its zigzag chunks of every sample; the
response log-probs gathered over the CP group give every rank the unsplit loss, and the ranks'
gradients add up to the unsplit gradient (what megatron's schedule and DDP do with them)."""

import pytest
import torch
import torch.distributed as dist

from tests.unit.backends.megatron_utils.spawn_util import spawn

pytestmark = pytest.mark.distributed

VOCAB = 11


def _rollout():
    g = torch.Generator().manual_seed(0)
    lengths, responses = (7, 10, 5, 13), (3, 5, 2, 6)
    return {
        "tokens": [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths],
        "response_lengths": list(responses),
        "loss_masks": [[1] * (r - 1) + [0] for r in responses],  # a masked token per sample
        "advantages": [torch.randn(r, generator=g).tolist() for r in responses],
        "log_probs": [(-torch.rand(r, generator=g)).tolist() for r in responses],
    }


def _sample_logits(rollout):
    """Fixed logits for every position of every (CP-padded) sample: the 'model output'."""
    g = torch.Generator().manual_seed(1)
    return [torch.randn(len(t) + 8, VOCAB, generator=g).requires_grad_() for t in rollout["tokens"]]


def _loss(rollout, logits, *, estimator, cp_rank, cp_size, cp_group, per_token=False):
    from slime.backends.megatron_utils import train_step as ts
    from slime.backends.megatron_utils.packing import cp_padded_length, zigzag_positions
    from slime.utils.losses import policy_loss

    mb = ts.build_micro_batch(rollout, list(range(4)), pad_to=4, device="cpu", keys=("advantages", "log_probs"),
                              cp_rank=cp_rank, cp_size=cp_size)
    rows = [x[zigzag_positions(cp_padded_length(len(t), cp_size), cp_rank, cp_size)]
            for x, t in zip(logits, rollout["tokens"])]
    row = torch.cat(rows)
    row = torch.cat([row, row.new_zeros(mb.packed.num_tokens - len(row), VOCAB)])  # end padding
    log_probs, entropy = ts.response_log_probs(row[None], mb, tp_group=None, temperature=1.0, with_entropy=True,
                                               cp_group=cp_group)
    loss, _ = policy_loss(log_probs=log_probs, old_log_probs=mb.tensors["log_probs"],
                          advantages=mb.tensors["advantages"], loss_masks=mb.loss_masks,
                          response_lengths=mb.packed.response_lengths, estimator=estimator, entropy=entropy,
                          entropy_coef=0.01, per_token=per_token)
    return loss, log_probs, mb


def _worker(rank, world_size, estimator):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    rollout = _rollout()
    logits = _sample_logits(rollout)
    whole_loss, whole_lp, _ = _loss(rollout, logits, estimator=estimator, cp_rank=0, cp_size=1, cp_group=None)
    whole_loss.backward()
    want = [x.grad.clone() for x in logits]
    for x in logits:
        x.grad = None
    loss, log_probs, _ = _loss(rollout, logits, estimator=estimator, cp_rank=rank, cp_size=world_size,
                               cp_group=dist.group.WORLD)
    # megatron's schedule multiplies the loss by the CP size, DDP averages over data x context parallel
    (loss * world_size).backward()
    got = [x.grad / world_size for x in logits]
    for grad in got:
        dist.all_reduce(grad)
    dist.destroy_process_group()
    return {
        "loss": (loss.item(), whole_loss.item()),
        "log_probs_diff": (log_probs - whole_lp).abs().max().item(),
        "grad_diff": max((a - b).abs().max().item() for a, b in zip(got, want)),
        "grad_scale": max(b.abs().max().item() for b in want),
    }


def _per_token_worker(rank, world_size):
    """--calculate-per-token-loss under CP as megatron-core 0.16 handles a 3-tuple loss: the loss
    as returned, gradients summed over data x context parallel ranks (DDP without averaging), then
    divided by the token counts summed over them (finalize_model_grads)."""
    from slime.backends.megatron_utils import train_step as ts

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    rollout = _rollout()
    logits = _sample_logits(rollout)
    whole_loss, _, whole_mb = _loss(rollout, logits, estimator="grpo", cp_rank=0, cp_size=1, cp_group=None,
                                    per_token=True)
    tokens = float(sum(m.sum() for m in whole_mb.loss_masks))
    (whole_loss / tokens).backward()
    want = [x.grad.clone() for x in logits]
    for x in logits:
        x.grad = None
    loss, _, mb = _loss(rollout, logits, estimator="grpo", cp_rank=rank, cp_size=world_size,
                        cp_group=dist.group.WORLD, per_token=True)
    out_loss, num_tokens, _ = ts.megatron_loss_output(loss, mb, {}, scale=float("nan"), per_token=True)
    out_loss.backward()
    got = [x.grad.clone() for x in logits]
    for grad in got:
        dist.all_reduce(grad)
    dist.all_reduce(num_tokens)
    dist.destroy_process_group()
    return {"grad_diff": max((a / num_tokens - b).abs().max().item() for a, b in zip(got, want)),
            "grad_scale": max(b.abs().max().item() for b in want)}


def test_cp2_per_token_loss_gradients_equal_unsplit(tmp_path):
    """gpu-first-contact trainer item 5 under CP: the per-token loss output (loss * CP, whole token
    count on each CP rank) gives the unsplit gradient divided by the true token count."""
    for r in spawn(_per_token_worker, 2, tmp_path):
        assert r["grad_scale"] > 1e-3 and r["grad_diff"] <= 1e-6, r


@pytest.mark.parametrize("estimator", ["grpo", "gspo"])  # gspo: a sequence-level ratio needs whole samples
def test_cp2_loss_and_gradients_equal_unsplit(estimator, tmp_path):
    results = spawn(_worker, 2, tmp_path, estimator=estimator)
    for r in results:
        loss, whole = r["loss"]
        assert loss == pytest.approx(whole, rel=1e-6, abs=1e-7), r
        assert r["log_probs_diff"] <= 1e-6, r
        assert r["grad_scale"] > 1e-3 and r["grad_diff"] <= 1e-6, r
