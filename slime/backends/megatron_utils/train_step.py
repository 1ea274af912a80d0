"""Micro-batches through megatron's pipeline schedule: log-probs (forward only) and loss steps.

A micro-batch is a set of samples packed into one row (`packing.pack_sequences`) that reaches the
model as megatron's `PackedSeqParams` (THD): attention stays within each sample on both the
Transformer Engine and the local spec. Its logits are turned into response-token log-probs (and
entropy) with vocab-parallel math, gathered over context-parallel ranks so that every CP rank
holds the whole micro-batch's tensors, then into the loss of `--loss-type`. Loss scaling makes
the step's gradient that of the mean over the global batch of each sample's mean token loss
(slime's reduction), whatever the DP size and the number of micro-batches: megatron divides each
micro-batch loss by the number of micro-batches and DDP averages over data-parallel ranks, so
each micro-batch loss is multiplied by `num_microbatches * dp_size / global_batch_size`. Under CP
the schedule multiplies the loss by the CP size and DDP averages over data x context parallel
ranks, which cancel: each CP rank back-propagates the whole loss through its own positions only.
With `--calculate-per-token-loss` megatron normalises instead (see `megatron_loss_output`): the
loss function returns its token count and megatron divides the summed gradients by the global one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from slime.backends.megatron_utils import collectives, routing_replay
from slime.backends.megatron_utils.logprobs import chunked_log_probs, gather_context_parallel
from slime.backends.megatron_utils.packing import PackedBatch, pack_sequences, packed_seq_params
from slime.backends.megatron_utils.parallel import megatron_parallel_state


@dataclass
class MicroBatch:
    """One packed micro-batch plus the per-sample tensors its loss needs (flat over response
    tokens, in sample order)."""

    packed: PackedBatch
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    loss_masks: list[torch.Tensor] = field(default_factory=list)
    # MoE routing replay (routing_replay.py): None leaves the routers alone; "own" routes normally,
    # "replay" replays `routing` [this rank's tokens, layers, topk], "record" keeps the choice in `recorded`
    routing_mode: str | None = None
    routing: torch.Tensor | None = None
    recorded: torch.Tensor | None = None


def build_micro_batch(rollout_data: dict, indices: list[int], *, pad_to: int, device, keys: tuple[str, ...] = (),
                      min_length: int = 0, cp_rank: int = 0, cp_size: int = 1) -> MicroBatch:
    """Pack the samples `indices` of `rollout_data` into this CP rank's row; `keys` name
    per-sample per-token lists (e.g. advantages, log_probs) concatenated into flat tensors (whole
    samples: the loss runs on the unsplit response tokens on every CP rank)."""
    packed = pack_sequences(
        [rollout_data["tokens"][i] for i in indices],
        [rollout_data["response_lengths"][i] for i in indices],
        sample_ids=indices, pad_to_multiple=pad_to, device=device, min_length=min_length,
        cp_rank=cp_rank, cp_size=cp_size,
    )
    tensors = {
        key: torch.cat([torch.as_tensor(rollout_data[key][i], dtype=torch.float32) for i in indices]).to(device)
        for key in keys if key in rollout_data
    }
    masks = [torch.as_tensor(rollout_data["loss_masks"][i], dtype=torch.float32, device=device) for i in indices]
    return MicroBatch(packed=packed, tensors=tensors, loss_masks=masks)


def response_log_probs(logits: torch.Tensor, mb: MicroBatch, *, tp_group, temperature: float,
                       with_entropy: bool, vocab_size: int | None = None,
                       cp_group=None, chunk_size: int = -1,
                       entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [1, T, V/tp] (this CP rank's row) -> flat log-probs (and entropy) of every response
    token of `mb`, [sum(response_lengths)] in sample order, the same on every CP rank.
    `chunk_size` > 0 (--log-probs-chunk-size): over the vocabulary that many tokens at a time.
    `entropy_grad=False`: the entropy carries no autograd graph (reported, not trained on)."""
    packed = mb.packed
    picked = logits[0].index_select(0, packed.logit_index)
    log_probs, entropy = chunked_log_probs(picked, packed.target_ids, chunk_size, tp_group=tp_group,
                                           temperature=temperature, with_entropy=with_entropy,
                                           vocab_size=vocab_size, entropy_grad=entropy_grad)
    def whole(values):
        return gather_context_parallel(values, packed.flat_index, packed.num_response_tokens, cp_group)
    return whole(log_probs), (whole(entropy) if entropy is not None else None)


def _set_routing(model, mb: MicroBatch) -> None:
    if mb.routing_mode == "record":
        routing_replay.set_record(model)
    elif mb.routing_mode is not None:
        routing_replay.set_replay(model, mb.routing if mb.routing_mode == "replay" else None)


def _forward_step(loss_fn: Callable, data_iterator, model):
    mb: MicroBatch = next(data_iterator)
    _set_routing(model, mb)
    output = model(
        input_ids=mb.packed.tokens,
        position_ids=mb.packed.position_ids,
        attention_mask=None,
        packed_seq_params=packed_seq_params(mb.packed),
    )
    if mb.routing_mode == "record":  # now: under pipeline parallelism the next forward overwrites it
        config = model.config
        mb.recorded = routing_replay.recorded(model, config.num_layers, config.moe_router_topk)
    return output, partial(loss_fn, mb)


def run_schedule(model: list, micro_batches: list[MicroBatch], loss_fn: Callable, *, forward_only: bool) -> list:
    """Run megatron's forward(-backward) schedule over the micro-batches; returns the per
    micro-batch dicts `loss_fn` reported (non-empty on the last pipeline stage only)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not micro_batches:
        return []
    if any(mb.routing_mode is not None for mb in micro_batches):
        for chunk in model:
            routing_replay.reset(chunk)
    # megatron divides seq_length by the CP size (and TP under SP) for pipeline messages
    seq_len = max(mb.packed.num_tokens * mb.packed.cp_size for mb in micro_batches)
    return get_forward_backward_func()(
        forward_step_func=partial(_forward_step, loss_fn),
        data_iterator=iter(micro_batches),
        model=model,
        num_microbatches=len(micro_batches),
        seq_length=seq_len,
        micro_batch_size=1,
        forward_only=forward_only,
    )


def log_prob_loss_fn(mb: MicroBatch, logits: torch.Tensor, **logprob_kw):
    """Forward-only loss function: reports response log-probs (and entropy) per sample.
    `logprob_kw`: tp_group, temperature, with_entropy, vocab_size, cp_group of `response_log_probs`."""
    log_probs, entropy = response_log_probs(logits, mb, **logprob_kw)
    split = list(mb.packed.response_lengths)
    out = {"sample_ids": mb.packed.sample_ids, "log_probs": [t.detach().cpu() for t in log_probs.split(split)]}
    if entropy is not None:
        out["entropy"] = [t.detach().cpu() for t in entropy.split(split)]
    return torch.zeros((), device=logits.device), out


def megatron_loss_output(loss: torch.Tensor, mb: MicroBatch, report: dict, *, scale: float, per_token: bool) -> tuple:
    """What a loss function hands megatron-core's schedule (0.16 `forward_step_calc_loss`).

    Per sample (`per_token` False): ``(loss * scale, report)``; megatron multiplies a 2-tuple's loss
    by the CP size and divides it by the micro-batch count, and DDP averages over DP x CP, which
    `scale` (``num_microbatches * dp / global_batch_size``) undoes.
    Per token (``--calculate-per-token-loss``, set on TransformerConfig too): ``(loss * cp,
    num_tokens, report)`` with `loss` the micro-batch's summed token losses: megatron leaves a
    3-tuple's loss as is, DDP sums gradients over DP x CP, and `finalize_model_grads` divides them
    by ``num_tokens`` summed over every micro-batch and DP x CP rank. Every CP rank holds the whole
    micro-batch's loss and counts all its tokens (CP times the true count in that sum), hence the
    factor CP (slime's convention). A 2-tuple here would give gradients DP x CP times too large:
    summed, never divided (megatron's token count stays 0)."""
    if not per_token:
        return loss * scale, report
    num_tokens = sum(mask.sum() for mask in mb.loss_masks).to(device=loss.device, dtype=torch.int)
    return loss * mb.packed.cp_size, num_tokens, report


def train_loss_fn(mb: MicroBatch, logits: torch.Tensor, *, compute_loss: Callable, scale: float,
                  per_token: bool = False, check_finite: bool = False, **logprob_kw):
    """Training loss function: `compute_loss(mb, log_probs, entropy, logits) -> (loss, metrics)`
    where metrics are sums over the micro-batch's samples; returns what megatron's schedule takes
    (`megatron_loss_output`; `scale` is used without `per_token` only).
    log_probs/entropy are whole (unsplit) on every CP rank; `logits` are this rank's row.
    `check_finite` (Megatron-LM's check_for_nan_in_loss_and_grad): a NaN/Inf loss raises."""
    log_probs, entropy = response_log_probs(logits, mb, **logprob_kw)
    loss, metrics = compute_loss(mb, log_probs, entropy, logits)
    if check_finite and not bool(torch.isfinite(loss.detach()).all()):
        raise RuntimeError(f"training loss is {loss.item()} for samples {list(mb.packed.sample_ids)} "
                           "(checked because --no-check-for-nan-in-loss-and-grad is not given)")
    metrics = {k: v.detach().float() for k, v in metrics.items()}
    metrics["loss"] = loss.detach().float()
    return megatron_loss_output(loss, mb, {"metrics": metrics}, scale=scale, per_token=per_token)


def reduce_step_metrics(outputs: list, norm: float) -> dict[str, float]:
    """Sum micro-batch metric sums over DP on the last stage, divide by the batch
    normaliser, and broadcast from the last pipeline stage to every stage."""
    mpu = megatron_parallel_state()
    names = sorted(outputs[0]["metrics"]) if outputs else []
    src = mpu.get_pipeline_model_parallel_last_rank()
    pp_group = mpu.get_pipeline_model_parallel_group()
    count = collectives.broadcast(collectives.device_tensor([len(names)], dtype=torch.long), src, pp_group)
    values = torch.zeros(int(count), dtype=torch.float64)
    if mpu.is_pipeline_last_stage():
        for out in outputs:
            values += torch.stack([out["metrics"][k].detach().double().cpu() for k in names])
        values = collectives.all_reduce(collectives.to_device(values), group=mpu.get_data_parallel_group())
        values = values / norm
    values = collectives.broadcast(collectives.to_device(values), src, pp_group)
    names = collectives.broadcast_object_list([names], src, pp_group)[0]
    return {f"train/{k}": float(v) for k, v in zip(names, values.tolist())}
