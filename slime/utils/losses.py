"""Per-micro-batch loss assembly on flat (packed) per-token tensors, keyed by `--loss-type`.

A micro-batch holds several samples' response tokens concatenated into 1-D tensors of
sum(response_lengths) entries. This module owns the reduction over them (slime's "sum of sample
means", or a plain masked token sum with --calculate-per-token-loss), the policy loss with its KL,
entropy and TIS terms, the critic's value loss and the SFT loss, and the `LOSS_FUNCTIONS` registry.
`custom_loss` (--custom-loss-function-path) is loaded and called by the backend, not here.
Per-token math comes from `slime.utils.ppo_utils`; all losses are returned unscaled (the trainer
divides by the number of micro-batches or tokens).
"""

from __future__ import annotations

import functools

from typing import Callable, Sequence

import torch
from torch import Tensor

from slime.utils import ppo_utils

Masks = Sequence[Tensor] | Tensor


def _split_masks(loss_masks: Masks, response_lengths: Sequence[int]) -> list[torch.Tensor]:
    if isinstance(loss_masks, torch.Tensor):
        if loss_masks.numel() != sum(response_lengths):
            raise ValueError(
                f"flat loss mask has {loss_masks.numel()} entries, responses have {sum(response_lengths)}"
            )
        loss_masks = loss_masks.split(list(response_lengths))
    if len(loss_masks) != len(response_lengths):
        raise ValueError(f"{len(loss_masks)} loss masks for {len(response_lengths)} samples")
    for i, (mask, n) in enumerate(zip(loss_masks, response_lengths)):
        if mask.numel() != n:
            raise ValueError(f"sample {i}: loss mask has {mask.numel()} entries, response_length is {n}")
    return [m.float() for m in loss_masks]


def get_sum_of_sample_mean(
    total_lengths: Sequence[int] | None,
    response_lengths: Sequence[int],
    loss_masks: Masks,
    calculate_per_token_loss: bool = False,
    sample_denoms: Sequence[float] | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Reducer x [sum(response_lengths)] -> scalar, as handed to custom loss functions.

    Default: sum over samples of each sample's masked mean, sum(x_i * m_i) / max(sum(m_i), 1);
    `sample_denoms` replaces the per-sample denominators max(sum(m_i), 1).
    With `calculate_per_token_loss`: the plain masked sum over all tokens. `loss_masks` is a list of
    per-sample [response_len_i] tensors or one flat tensor. `total_lengths` (prompt + response,
    optional) is checked to be at least the response lengths.
    """
    masks = _split_masks(loss_masks, response_lengths)
    if total_lengths is not None:
        for i, (total, resp) in enumerate(zip(total_lengths, response_lengths)):
            if total < resp:
                raise ValueError(f"sample {i}: total_length {total} < response_length {resp}")
    # One weight per token: the mask itself (token sum) or mask / max(sample's mask sum, 1).
    if calculate_per_token_loss:
        weights = masks
    elif sample_denoms is not None:
        weights = [m / float(d) for m, d in zip(masks, sample_denoms, strict=True)]
    else:
        weights = [m / m.sum().clamp_min(1) for m in masks]
    flat_weights = torch.cat(weights) if weights else torch.zeros(0)

    def reduce(x: torch.Tensor) -> torch.Tensor:
        if x.numel() != flat_weights.numel():
            raise ValueError(f"reducer got {x.numel()} tokens, expected {flat_weights.numel()}")
        return (x * flat_weights.to(x.device)).sum()

    return reduce


def sum_of_sample_mean(
    x: torch.Tensor, response_lengths: Sequence[int], loss_masks: Masks, per_token: bool = False
) -> torch.Tensor:
    """Reduce flat per-token `x` to a scalar; see `get_sum_of_sample_mean` (per_token = token sum)."""
    return get_sum_of_sample_mean(None, response_lengths, loss_masks, per_token)(x)


def _clip_terms(*, advantages, ppo_kl, eps_clip, eps_clip_high, eps_clip_c, **_):
    return ppo_utils.compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)


def _cispo_terms(*, log_probs, advantages, ppo_kl, eps_clip, eps_clip_high, **_):
    return ppo_utils.compute_cispo_loss(ppo_kl, log_probs, advantages, eps_clip, eps_clip_high)


def _token_ppo_kl(log_probs, old_log_probs, masks, response_lengths):
    return old_log_probs - log_probs


def _sequence_ppo_kl(log_probs, old_log_probs, masks, response_lengths):
    per_sample = list((old_log_probs - log_probs).split(list(response_lengths)))
    return torch.cat(ppo_utils.compute_sequence_level_ppo_kl(per_sample, masks))


# --advantage-estimator -> (how ppo_kl is formed, which per-token surrogate uses it).
POLICY_LOSS_VARIANTS: dict[str, tuple[Callable, Callable]] = {
    "grpo": (_token_ppo_kl, _clip_terms),
    "ppo": (_token_ppo_kl, _clip_terms),
    "reinforce_plus_plus": (_token_ppo_kl, _clip_terms),
    "reinforce_plus_plus_baseline": (_token_ppo_kl, _clip_terms),
    "gspo": (_sequence_ppo_kl, _clip_terms),
    "cispo": (_token_ppo_kl, _cispo_terms),
}


def _apply_tis(pg_losses, masks, *, old_log_probs, rollout_log_probs, response_lengths,
               total_lengths, tis_clip, tis_clip_low, tis_function):
    """Weight pg_losses by truncated importance weights; returns (pg_losses, masks, token metrics)."""
    if rollout_log_probs is None:
        raise ValueError("--use-tis needs rollout log probs (none given)")
    if tis_function is not None:
        lengths = list(response_lengths)
        return tis_function(
            pg_loss=pg_losses, train_log_probs=list(old_log_probs.split(lengths)),
            rollout_log_probs=list(rollout_log_probs.split(lengths)), loss_masks=masks,
            response_lengths=lengths, total_lengths=total_lengths,
        )
    weights, clipfrac = ppo_utils.compute_tis_weights(
        old_log_probs, rollout_log_probs, tis_clip, tis_clip_low
    )
    raw = torch.exp(old_log_probs.float() - rollout_log_probs.float()).detach()
    return pg_losses * weights, masks, {"tis": raw, "tis_clipfrac": clipfrac}


def _add_regularizers(loss, metrics, reduce, *, log_probs, ref_log_probs, use_kl_loss, kl_loss_coef,
                      kl_loss_type, entropy, entropy_coef):
    """loss - entropy_coef * reduce(entropy) + kl_loss_coef * reduce(KL(actor || ref)); fills metrics."""
    if entropy is not None:
        metrics["entropy_loss"] = reduce(entropy)
        loss = loss - entropy_coef * metrics["entropy_loss"]
    if use_kl_loss:
        metrics["kl_loss"] = reduce(ppo_utils.compute_approx_kl(log_probs, ref_log_probs, kl_loss_type))
        loss = loss + kl_loss_coef * metrics["kl_loss"]
    return loss


def policy_loss(
    *,
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_masks: Masks,
    response_lengths: Sequence[int], total_lengths: Sequence[int] | None = None,
    estimator: str = "grpo", eps_clip: float = 0.2, eps_clip_high: float | None = None,
    eps_clip_c: float | None = None, ppo_kl: Tensor | None = None,
    ref_log_probs: Tensor | None = None, use_kl_loss: bool = False, kl_loss_coef: float = 0.0,
    kl_loss_type: str = "k1", entropy: Tensor | None = None, entropy_coef: float = 0.0,
    rollout_log_probs: Tensor | None = None, use_tis: bool = False, tis_clip: float = 2.0,
    tis_clip_low: float = 0.0, tis_function: Callable | None = None, per_token: bool = False,
    pg_loss_reducer: Callable | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy loss of one micro-batch: reduce(pg) - entropy_coef * reduce(H) + kl_loss_coef * reduce(KL).

    Token tensors are flat [sum(response_lengths)]. `estimator` picks the surrogate: PPO clip on
    per-token ratios (grpo, ppo, reinforce_plus_plus*), on the sequence ratio (gspo), or CISPO.
    `ppo_kl` overrides old_log_probs - log_probs (e.g. GSPO under context parallelism, from
    ppo_utils.compute_gspo_kl). `use_tis` weights the per-token loss by truncated exp(old -
    rollout); with it, a `tis_function(pg_loss=, train_log_probs=, rollout_log_probs=, loss_masks=,
    response_lengths=, total_lengths=) -> (pg_loss, loss_masks, metrics)` replaces that, and the
    masks it returns drive every reduction (without `use_tis` it is not called, as in slime).
    `pg_loss_reducer(total_lengths, response_lengths, masks, per_token) -> reducer` (slime's
    --custom-pg-loss-reducer-function-path factory) reduces the pg_loss alone. Returns (scalar loss, detached scalar metrics pg_loss,
    pg_clipfrac, ppo_kl and, as applicable, kl_loss, entropy_loss, tis, tis_clipfrac,
    train_rollout_logprob_abs_diff).
    """
    _check_policy_inputs(estimator, log_probs, response_lengths, use_kl_loss, ref_log_probs)
    masks = _split_masks(loss_masks, response_lengths)
    make_kl, surrogate = POLICY_LOSS_VARIANTS[estimator]
    if ppo_kl is None:
        ppo_kl = make_kl(log_probs, old_log_probs, masks, response_lengths)
    pg_losses, clipfrac = surrogate(
        log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages, ppo_kl=ppo_kl,
        eps_clip=eps_clip, eps_clip_high=eps_clip_high if eps_clip_high is not None else eps_clip,
        eps_clip_c=eps_clip_c)
    token_metrics = {}
    if use_tis:
        pg_losses, masks, token_metrics = _apply_tis(
            pg_losses, masks, old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs,
            response_lengths=response_lengths, total_lengths=total_lengths, tis_clip=tis_clip,
            tis_clip_low=tis_clip_low, tis_function=tis_function,
        )
    reduce = get_sum_of_sample_mean(total_lengths, response_lengths, masks, per_token)
    pg_reduce = pg_loss_reducer(total_lengths, list(response_lengths), masks, per_token) if pg_loss_reducer else reduce
    metrics = {"pg_loss": pg_reduce(pg_losses), "pg_clipfrac": reduce(clipfrac), "ppo_kl": reduce(ppo_kl)}
    metrics.update({name: reduce(value) for name, value in token_metrics.items()})
    if rollout_log_probs is not None:
        metrics["train_rollout_logprob_abs_diff"] = reduce((old_log_probs - rollout_log_probs).abs())
    loss = _add_regularizers(
        metrics["pg_loss"], metrics, reduce, log_probs=log_probs, ref_log_probs=ref_log_probs,
        use_kl_loss=use_kl_loss, kl_loss_coef=kl_loss_coef, kl_loss_type=kl_loss_type, entropy=entropy,
        entropy_coef=entropy_coef,
    )
    return loss, {name: value.detach() for name, value in metrics.items()}


def _check_policy_inputs(estimator, log_probs, response_lengths, use_kl_loss, ref_log_probs):
    if estimator not in POLICY_LOSS_VARIANTS:
        raise ValueError(
            f"--advantage-estimator {estimator!r} has no policy loss; choices: {sorted(POLICY_LOSS_VARIANTS)}"
        )
    if log_probs.numel() != sum(response_lengths):
        raise ValueError(f"log_probs has {log_probs.numel()} tokens, responses have {sum(response_lengths)}")
    if use_kl_loss and ref_log_probs is None:
        raise ValueError("--use-kl-loss needs reference log probs (--ref-load), none given")


def value_loss(
    *,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_masks: Masks,
    response_lengths: Sequence[int],
    value_clip: float = 0.2,
    total_lengths: Sequence[int] | None = None,
    per_token: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Critic loss of one micro-batch: reduce(max((V_clip - R)^2, (V - R)^2)) (--value-clip).

    Token tensors are flat [sum(response_lengths)]. Returns (scalar loss, {value_loss,
    value_clipfrac} detached).
    """
    reduce = get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks, per_token)
    losses, clipfrac = ppo_utils.compute_value_loss(values, old_values, returns, value_clip)
    loss = reduce(losses)
    return loss, {"value_loss": loss.detach(), "value_clipfrac": reduce(clipfrac).detach()}


def sft_loss(
    *,
    log_probs: torch.Tensor,
    loss_masks: Masks,
    response_lengths: Sequence[int],
    total_lengths: Sequence[int] | None = None,
    per_token: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log likelihood of the masked response tokens: -reduce(log_probs).

    `log_probs` is flat [sum(response_lengths)]. Returns (scalar loss, {"loss": detached loss}).
    """
    loss = -get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks, per_token)(log_probs)
    return loss, {"loss": loss.detach()}


LOSS_FUNCTIONS: dict[str, Callable] = {
    "policy_loss": policy_loss,
    "value_loss": value_loss,
    "sft_loss": sft_loss,
}


def get_loss_function(loss_type: str) -> Callable:
    """The loss function for `--loss-type`; custom_loss is the caller's (--custom-loss-function-path)."""
    if loss_type == "custom_loss":
        raise ValueError(
            "--loss-type custom_loss is dispatched to --custom-loss-function-path by the trainer, "
            "not through LOSS_FUNCTIONS"
        )
    if loss_type not in LOSS_FUNCTIONS:
        choices = sorted(LOSS_FUNCTIONS) + ["custom_loss"]
        raise ValueError(f"--loss-type {loss_type!r} is unknown; choices: {choices}")
    return LOSS_FUNCTIONS[loss_type]


def _policy_options(args) -> dict:
    return {
        "estimator": args.advantage_estimator,
        "eps_clip": args.eps_clip,
        "eps_clip_high": args.eps_clip_high,
        "eps_clip_c": args.eps_clip_c,
        "use_kl_loss": args.use_kl_loss,
        "kl_loss_coef": args.kl_loss_coef,
        "kl_loss_type": args.kl_loss_type,
        "entropy_coef": args.entropy_coef,
        "use_tis": args.use_tis,
        "tis_clip": args.tis_clip,
        "tis_clip_low": args.tis_clip_low,
        "tis_function": _custom_tis(args),
        "per_token": args.calculate_per_token_loss,
        "pg_loss_reducer": _custom_pg_reducer(args),
    }


def _custom_pg_reducer(args) -> Callable | None:
    """`--custom-pg-loss-reducer-function-path`: the factory, its reducer's result checked."""
    path = getattr(args, "custom_pg_loss_reducer_function_path", None)
    if not path:
        return None
    from slime.utils.misc import load_function
    from slime.utils.plugins import call_pg_loss_reducer_factory

    return functools.partial(call_pg_loss_reducer_factory, load_function(path))


def _custom_tis(args) -> Callable | None:
    """`--custom-tis-function-path` bound to `args` (slime calls it as fn(args=args, ...))."""
    path = getattr(args, "custom_tis_function_path", None)
    if not path:
        return None
    from slime.utils.misc import load_function
    from slime.utils.plugins import call_custom_tis

    return functools.partial(call_custom_tis, load_function(path), args)


def _value_options(args) -> dict:
    return {"value_clip": args.value_clip, "per_token": args.calculate_per_token_loss}


def _sft_options(args) -> dict:
    return {"per_token": args.calculate_per_token_loss}


_OPTION_READERS: dict[str, Callable] = {
    "policy_loss": _policy_options,
    "value_loss": _value_options,
    "sft_loss": _sft_options,
}


def loss_options_from_args(loss_type: str, args) -> dict:
    """Non-tensor keyword options of LOSS_FUNCTIONS[loss_type], read from parsed flags.

    policy_loss reads args.advantage_estimator, eps_clip, eps_clip_high, eps_clip_c, use_kl_loss,
    kl_loss_coef, kl_loss_type, entropy_coef, use_tis, tis_clip, tis_clip_low,
    custom_tis_function_path (loaded and bound to args), calculate_per_token_loss,
    custom_pg_loss_reducer_function_path (loaded); value_loss reads value_clip, calculate_per_token_loss; sft_loss reads
    calculate_per_token_loss.
    """
    get_loss_function(loss_type)
    return _OPTION_READERS[loss_type](args)
