"""Full Hugging Face tensors from a sharded megatron-core GPTModel, in size-bounded buckets.

Owns ``iter_hf_buckets`` (the trainer side of every weight sync and of HF export from a live
trainer), ``is_weight_sender`` and ``bucket_by_bytes``.

Who ends up with what: every rank of the trainer must iterate ``iter_hf_buckets`` together
(it runs collectives). Inside one pipeline stage, TP shards are all-gathered over the TP group
and experts over the expert-parallel group (then expert-TP), so *every* rank of a stage holds
the full HF tensors of that stage's layers (stage 0 adds the embedding, the last stage the final
norm and the output layer). Exactly one rank per stage, the one with data-parallel rank 0 and TP
rank 0 (``is_weight_sender``), should send them; the union over the senders of all stages is the
whole HF checkpoint. Vocabulary padding is removed; names are HF names.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

from slime.backends.megatron_utils import collectives
from slime.backends.megatron_utils.hf_loader import mapped_tensors, shard_context_for
from slime.backends.megatron_utils.parallel import megatron_parallel_state as _mpu
from slime.models import fused_groups, weight_map_for
from slime.models.fused import fused_set
from slime.models.weight_map import gather_tensor, global_name

logger = logging.getLogger(__name__)


def is_weight_sender() -> bool:
    """True on the one rank per pipeline stage that sends its stage's tensors (DP rank 0, TP rank 0)."""
    mpu = _mpu()
    return (mpu.get_data_parallel_rank(with_context_parallel=True) == 0
            and mpu.get_tensor_model_parallel_rank() == 0)


def _sizes(args_or_sizes) -> tuple[int, int]:
    """(make_vocab_size_divisible_by, tensor_model_parallel_size) from a Namespace or a dict."""
    get = args_or_sizes.get if isinstance(args_or_sizes, dict) else lambda k: getattr(args_or_sizes, k, None)
    divisible_by, tp_size = get("make_vocab_size_divisible_by"), get("tensor_model_parallel_size")
    if divisible_by is None or tp_size is None:
        raise ValueError("iter_hf_buckets needs make_vocab_size_divisible_by and tensor_model_parallel_size "
                         "(--make-vocab-size-divisible-by, --tensor-model-parallel-size)")
    return int(divisible_by), int(tp_size)


def _all_gather(tensor: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's ``tensor`` of ``group`` (rank order); the input itself when the group has 1 rank."""
    return collectives.all_gather(collectives.to_device(tensor), group=group)


def _all_gather_many(tensors: list[torch.Tensor], group) -> list[list[torch.Tensor]]:
    """``[_all_gather(t, group) for t in tensors]`` in one collective per dtype: the tensors travel
    flattened into one buffer and come back as views of the gathered buffers."""
    if dist.get_world_size(group=group) == 1:
        return [_all_gather(t, group) for t in tensors]
    out: list = [None] * len(tensors)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, tensor in enumerate(tensors):
        by_dtype.setdefault(tensor.dtype, []).append(i)
    for members in by_dtype.values():
        sizes = [tensors[i].numel() for i in members]
        per_rank = [flat.split(sizes) for flat in _all_gather(torch.cat([tensors[i].reshape(-1) for i in members]), group)]
        for k, i in enumerate(members):
            out[i] = [pieces[k].view(tensors[i].shape) for pieces in per_rank]
    return out


# local expert bytes gathered in one collective (times the EP size once gathered); a layer's
# experts usually fit, so a sync runs about one expert gather per layer instead of one per weight
EXPERT_GATHER_BYTES = 32 << 20


def _dense_full_tensor(wmap, full_name: str, param: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(global megatron name, full tensor) of a non-expert parameter, merged over TP."""
    shards = [param] if wmap.split_kind(full_name) == "replicated" else \
        _all_gather(param, _mpu().get_tensor_model_parallel_group())
    return full_name, gather_tensor(wmap, full_name, shards)


def _expert_full_tensors(wmap, ctx, named: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(global megatron name, full tensor) for local expert parameters: each one's slot on every
    EP rank (EP rank order), merged over expert-TP; gathered together (``_all_gather_many``)."""
    if not named:
        return
    mpu = _mpu()
    etp = _all_gather_many([param for _, param in named], mpu.get_expert_tensor_parallel_group())
    etp_size = len(etp[0])
    ep = _all_gather_many([shard for shards in etp for shard in shards], mpu.get_expert_model_parallel_group())
    for j, (name, _) in enumerate(named):
        per_etp = ep[j * etp_size:(j + 1) * etp_size]  # per expert-TP shard: its copy on every EP rank
        for ep_rank in range(ctx.ep_size):
            owner_name = global_name(name, dataclasses.replace(ctx, ep_rank=ep_rank))
            yield owner_name, gather_tensor(wmap, owner_name, [copies[ep_rank] for copies in per_etp])


def _full_megatron_tensors(wmap, ctx, named: Iterable) -> Iterator[tuple[str, torch.Tensor]]:
    """``(global megatron name, full tensor)`` for local parameters ``named``, in their order
    (several per expert parameter). Consecutive expert parameters are gathered together, up to
    ``EXPERT_GATHER_BYTES`` of local bytes."""
    experts, size = [], 0
    for name, param in named:
        full_name = global_name(name, ctx)
        if not wmap.is_expert(full_name):
            yield from _expert_full_tensors(wmap, ctx, experts)
            experts, size = [], 0
            yield _dense_full_tensor(wmap, full_name, param)
            continue
        experts.append((name, param))
        size += param.numel() * param.element_size()
        if size >= EXPERT_GATHER_BYTES:
            yield from _expert_full_tensors(wmap, ctx, experts)
            experts, size = [], 0
    yield from _expert_full_tensors(wmap, ctx, experts)


def _skip(model, name: str) -> bool:
    """The last stage's copy of a tied output layer: stage 0 already sends the embedding."""
    tied = getattr(model, "share_embeddings_and_output_weights", False)
    return tied and name == "output_layer.weight" and not getattr(model, "pre_process", True)


@torch.no_grad()
def iter_hf_named_tensors(model, hf_config: dict, args_or_sizes, to_cpu: bool = True) -> Iterator:
    """Yield ``(hf_name, full tensor)`` for this rank's pipeline stage, parameter by parameter.

    Collective: every trainer rank must iterate to the end together. ``model`` is the
    unwrapped GPTModel chunk of this rank; ``args_or_sizes`` gives
    ``make_vocab_size_divisible_by`` and ``tensor_model_parallel_size``. Tensors keep the
    parameters' dtype; they are CPU copies when ``to_cpu`` else on the parameters' device.
    """
    divisible_by, tp_size = _sizes(args_or_sizes)
    wmap = weight_map_for(hf_config, divisible_by, tp_size)
    ctx = shard_context_for(model, wmap.num_experts)
    named = ((name, param.detach()) for name, param in mapped_tensors(model) if not _skip(model, name))
    for full_name, full in _full_megatron_tensors(wmap, ctx, named):
        for hf_name, tensor in wmap.to_hf(full_name, full):
            yield hf_name, (tensor.to("cpu", copy=True) if to_cpu else tensor.contiguous())


def _fused_units(named: Iterable, groups: tuple) -> Iterator[list]:
    """``named`` as units: a fused set (see `slime.models.fused`) is one unit, emitted when
    its last member arrives; any other tensor is a unit of its own. A member whose partners never
    come is an error naming them (SGLang would silently drop it)."""
    held: dict[tuple, dict] = {}
    for name, tensor in named:
        members = fused_set(name, groups)
        if not members:
            yield [(name, tensor)]
            continue
        have = held.setdefault(members, {})
        have[name] = tensor
        if len(have) == len(members):
            del held[members]
            yield [(member, have[member]) for member in members]
    if held:
        lone = [f"{sorted(have)} without {[m for m in members if m not in have]}" for members, have in held.items()]
        raise ValueError(f"tensors SGLang fuses on load arrived without their partners: {'; '.join(lone)}")


def bucket_by_bytes(named: Iterable, bucket_bytes: int, groups: tuple = ()) -> Iterator[list]:
    """Group ``(name, tensor)`` pairs into lists of at most ``bucket_bytes`` bytes, in order.

    The tensors of one fused set (``groups``, see `slime.models.fused`: e.g. MLA's
    ``q_a_proj`` and ``kv_a_proj_with_mqa``) always share a bucket, placed where its last member
    arrives. A tensor (or fused set) larger than ``bucket_bytes`` forms a bucket of its own; no
    bucket is empty.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive (--update-weight-buffer-size), got {bucket_bytes}")
    bucket, size = [], 0
    for unit in _fused_units(named, tuple(groups)):
        nbytes = sum(tensor.numel() * tensor.element_size() for _, tensor in unit)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.extend(unit)
        size += nbytes
    if bucket:
        yield bucket


def iter_hf_buckets(model, hf_config: dict, args_or_sizes, bucket_bytes: int, to_cpu: bool = True) -> Iterator[list]:
    """Buckets (lists of ``(hf_name, full tensor)``) of this pipeline stage's HF weights.

    Collective like ``iter_hf_named_tensors``: every rank iterates, every rank of a stage gets
    the same buckets; send them from ``is_weight_sender()`` ranks only. Each bucket holds at
    most ``bucket_bytes`` bytes, except a single tensor larger than that, which goes alone; the
    tensors SGLang fuses on load (`slime.models.fused`) always share a bucket.
    """
    named = iter_hf_named_tensors(model, hf_config, args_or_sizes, to_cpu)
    return bucket_by_bytes(named, bucket_bytes, fused_groups(hf_config))


def write_hf_checkpoint(model, args_or_sizes, origin_hf_dir, output_dir) -> Path:
    """Write ``model`` (one pipeline stage holding every layer) as an HF checkpoint in the origin
    config's dtype, with the origin's config and tokenizer files. Collective: TP and expert
    shards are gathered on every rank, rank 0 writes."""
    from slime.backends.megatron_utils.hf_io import read_hf_config, save_hf_checkpoint

    config = read_hf_config(origin_hf_dir)
    dtype = getattr(torch, str(config.get("torch_dtype") or config.get("dtype") or "float32"))
    named = [(name, t.to(dtype)) for name, t in iter_hf_named_tensors(model, config, args_or_sizes)]
    if dist.get_rank() == 0:
        save_hf_checkpoint(named, output_dir, origin_hf_dir)
    collectives.barrier()
    return Path(output_dir)
