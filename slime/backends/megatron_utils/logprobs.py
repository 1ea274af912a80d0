"""Log-probs of target tokens and entropy from vocab-parallel logits.

With tensor parallelism each rank holds logits for a contiguous shard of the (padded)
vocabulary. The log-partition function and the entropy need sums over the whole vocabulary, so
they are all-reduced across the TP group with autograd-aware collectives; on one rank
(`tp_group=None` or size 1) this is plain log-softmax. Logits are divided by the rollout
temperature first, matching what the engines report as the sampled tokens' log-probs.

Under context parallelism each CP rank predicts only the response tokens at its positions;
`gather_context_parallel` puts every rank's values into the micro-batch's flat response vector
so each CP rank computes the loss on exactly the unsplit tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from slime.backends.megatron_utils import collectives


def _tp(group) -> tuple[int, int]:
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class _ReduceReplicated(torch.autograd.Function):
    """All-reduce (sum) whose result every TP rank then uses identically: the loss downstream is
    replicated, so each rank's gradient is already the full one and the backward is the identity
    (megatron's reduce-from-tensor-parallel-region; torch's autograd all_reduce would sum the
    replicated gradients and scale them by the TP size)."""

    @staticmethod
    def forward(ctx, x, group):
        return collectives.all_reduce(collectives.to_device(x.clone()), group=group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _sum(x: torch.Tensor, group, size: int) -> torch.Tensor:
    return _ReduceReplicated.apply(x, group) if size > 1 else x


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    tp_group=None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    vocab_size: int | None = None,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [N, V_local] (this rank's vocab shard), targets [N] (global ids) ->
    (log p(target) [N], entropy [N] or None), in fp32, differentiable w.r.t. logits.
    `entropy_grad=False` (--entropy-coef 0: the entropy is only reported) computes the same entropy
    without an autograd graph, so none of its [N, V_local] temporaries is kept for the backward.

    Columns at or beyond `vocab_size` (megatron pads the vocabulary to a multiple of
    `make_vocab_size_divisible_by * TP`) are excluded, so the distribution is the tokenizer's
    and does not change with the TP size."""
    rank, size = _tp(tp_group)
    logits = logits.float() / temperature
    v_local = logits.shape[-1]
    if vocab_size is not None and (rank + 1) * v_local > vocab_size:
        padded = torch.arange(rank * v_local, (rank + 1) * v_local, device=logits.device) >= vocab_size
        logits = logits.masked_fill(padded, float("-inf"))
    with torch.no_grad():
        peak = logits.max(dim=-1, keepdim=True).values
        if size > 1:
            peak = collectives.all_reduce(collectives.to_device(peak), "max", group=tp_group)
    shifted = logits - peak
    exp = shifted.exp()
    sum_exp = _sum(exp.sum(dim=-1), tp_group, size)
    log_z = sum_exp.log()
    start = rank * v_local
    in_shard = (targets >= start) & (targets < start + v_local)
    local = (targets - start).clamp(0, v_local - 1)
    gathered = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1)
    picked = torch.where(in_shard, gathered, torch.zeros_like(gathered))
    log_probs = _sum(picked, tp_group, size) - log_z
    if not with_entropy:
        return log_probs, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        # H = log Z - E_p[shifted logit]
        weighted = torch.where(exp > 0, exp * shifted, torch.zeros_like(exp))  # 0 * -inf at padding
        expected = _sum(weighted.sum(dim=-1), tp_group, size) / sum_exp
        return log_probs, log_z - expected


def chunked_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int = -1,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`vocab_parallel_log_probs` over `chunk_size` tokens (rows of `logits`) at a time
    (`--log-probs-chunk-size`; <= 0: all at once), concatenated: the fp32 [chunk, V_local]
    temporaries replace the [N, V_local] ones. Each chunk's TP collectives run on every TP rank
    alike, since all ranks hold the same N tokens."""
    n = logits.shape[0]
    if chunk_size <= 0 or n <= chunk_size:
        return vocab_parallel_log_probs(logits, targets, **kwargs)
    parts = [vocab_parallel_log_probs(logits[i:i + chunk_size], targets[i:i + chunk_size], **kwargs)
             for i in range(0, n, chunk_size)]
    log_probs = torch.cat([lp for lp, _ in parts])
    entropy = torch.cat([ent for _, ent in parts]) if parts[0][1] is not None else None
    return log_probs, entropy


def gather_context_parallel(values: torch.Tensor, flat_index: torch.Tensor, total: int, cp_group=None) -> torch.Tensor:
    """values [R, ...] at flat positions `flat_index` (this CP rank's share) -> the whole [total, ...] tensor.

    The CP ranks' positions are disjoint and cover 0..total-1, so the vector is an all-reduced
    sum. Every CP rank then computes the same loss from it, so the backward keeps each rank's
    gradient for its own positions (no second reduction): the pipeline schedule multiplies the
    loss by the CP size and DDP averages gradients over data x context parallel, which together
    give the unsplit gradient."""
    full = values.new_zeros((total, *values.shape[1:])).index_put((flat_index,), values)
    _, size = _tp(cp_group)
    return _sum(full, cp_group, size)
