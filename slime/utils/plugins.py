"""The one place user plugin functions are called and their results normalised.

Every plugin point of docs/slime-compat.md §3 has a `call_*` function here taking the loaded
callable (from `slime.utils.misc.load_function`) plus the documented arguments. It calls the user
function with slime's signature, awaits it when it is async, wraps the documented shorthand returns
(a bare list / dict / bool) and raises a TypeError naming the flag, the function and what came back
when the return does not match. Rollout and training code call these, never the user function.

`PLUGIN_FLAGS` maps each flag's argparse dest to its documented signature (used by tests and docs);
it lives in `slime.utils.plugin_signatures` and is re-exported here.
"""

from __future__ import annotations

import contextvars
import inspect
import numbers
from typing import Any, Callable

import numpy as np
import torch

from slime.utils.misc import accepts_kwarg, declares_param, filter_kwargs_for, function_path
from slime.utils.plugin_signatures import PLUGIN_FLAGS, bad_return
from slime.utils.types import DynamicFilterOutput, RolloutFnEvalOutput, RolloutFnTrainOutput, Sample

TRAIN_DATA_REQUIRED_KEYS = (
    "tokens",
    "response_lengths",
    "rewards",
    "raw_reward",
    "truncated",
    "sample_indices",
    "loss_masks",
)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _is_group_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(g, list) and all(isinstance(s, Sample) for s in g) for g in value
    )


def _regroup(dest: str, fn: Callable, args, samples: list[Sample]) -> list[list[Sample]]:
    """Split a flat sample list into groups of `--n-samples-per-prompt` (slime flattens anyway)."""
    n = int(getattr(args, "n_samples_per_prompt", 1) or 1)
    if len(samples) % n:
        raise bad_return(dest, fn, f"groups, or a flat list whose length divides by {n}", samples)
    return [samples[i : i + n] for i in range(0, len(samples), n)]


def call_rollout_fn(fn: Callable, args, rollout_id: int, data_source, evaluation: bool = False):
    """Call `--rollout-function-path` (or `--eval-function-path` when `evaluation`).

    Returns RolloutFnTrainOutput (train; a bare list[list[Sample]], or a flat list[Sample] split
    into groups of n_samples_per_prompt, is wrapped) or RolloutFnEvalOutput (eval; a bare
    dict[str, dict] is wrapped). Sets the current rollout id for sample hooks first.
    """
    set_current_rollout_id(rollout_id)
    out = fn(args, rollout_id, data_source, evaluation=evaluation)
    if evaluation:
        dest = "eval_function_path"
        if isinstance(out, dict):
            out = RolloutFnEvalOutput(data=out)
        if not isinstance(out, RolloutFnEvalOutput) or not all(
            isinstance(v, dict) for v in out.data.values()
        ):
            raise bad_return(dest, fn, "RolloutFnEvalOutput or dict[str, dict]", out)
        return out
    dest = "rollout_function_path"
    if isinstance(out, list):
        out = RolloutFnTrainOutput(samples=out)
    if not isinstance(out, RolloutFnTrainOutput) or not isinstance(out.samples, list):
        raise bad_return(dest, fn, "RolloutFnTrainOutput or list[list[Sample]]", out)
    if out.samples and all(isinstance(s, Sample) for s in out.samples):
        out.samples = _regroup(dest, fn, args, out.samples)
    if not _is_group_list(out.samples):
        raise bad_return(dest, fn, "samples as list[list[Sample]]", out.samples)
    return out


async def call_custom_generate(
    fn: Callable, args, sample: Sample, sampling_params: dict, evaluation: bool = False
) -> list[Sample]:
    """Call `--custom-generate-function-path`; `evaluation=` is passed only if `fn` declares a
    parameter of that name, as slime does (a function taking **kwargs is called without it).

    Returns a list of Samples (a single returned Sample becomes a one-element list).
    """
    if declares_param(fn, "evaluation"):
        out = await _maybe_await(fn(args, sample, sampling_params, evaluation=evaluation))
    else:
        out = await _maybe_await(fn(args, sample, sampling_params))
    if isinstance(out, Sample):
        return [out]
    if isinstance(out, list) and out and all(isinstance(s, Sample) for s in out):
        return out
    raise bad_return("custom_generate_function_path", fn, "Sample or non-empty list[Sample]", out)


def _is_reward(value: Any) -> bool:
    return isinstance(value, (numbers.Real, dict))


async def call_reward_fn(fn: Callable, args, sample_or_samples, group: bool = False, **kwargs):
    """Call `--custom-rm-path` (sync or async) on one Sample, or on a group with `--group-rm`;
    `kwargs` are passed through to the user function.

    Returns a float/dict reward, or (group) a list of them with one entry per sample.
    """
    out = await _maybe_await(fn(args, sample_or_samples, **kwargs))
    if not group:
        if not _is_reward(out):
            raise bad_return("custom_rm_path", fn, "a float or a dict", out)
        return out
    if isinstance(out, tuple):
        out = list(out)
    if not isinstance(out, list) or not all(_is_reward(r) for r in out):
        raise bad_return("custom_rm_path", fn, "(with --group-rm) a list of floats or dicts", out)
    if len(out) != len(sample_or_samples):
        raise bad_return(
            "custom_rm_path", fn, f"(with --group-rm) {len(sample_or_samples)} rewards", out
        )
    return out


def _as_bool(value: Any) -> bool | None:
    """bool, numpy bool or a one-element tensor as a Python bool; None when it is none of these."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return bool(value.item())
    return None


def call_dynamic_filter(fn: Callable, args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """Call `--dynamic-sampling-filter-path` on one group; a bare bool is wrapped."""
    raw = fn(args, samples, **kwargs)
    out = raw if isinstance(raw, DynamicFilterOutput) else DynamicFilterOutput(keep=raw)
    keep = _as_bool(out.keep)
    if keep is None or (out.reason is not None and not isinstance(out.reason, str)):
        raise bad_return("dynamic_sampling_filter_path", fn, "DynamicFilterOutput or bool", raw)
    return DynamicFilterOutput(keep=keep, reason=out.reason,
                               keep_when_insufficient=bool(getattr(out, "keep_when_insufficient", False)))


async def call_sample_hook(fn: Callable, args, sample: Sample, **kwargs) -> Sample:
    """Call one `--rollout-sample-hook-path` hook (sync or async) as slime does: `hook(args,
    sample, **kw)` with `kwargs` cut to the keywords the hook declares (all with **kwargs).
    None means `sample` unchanged."""
    out = await _maybe_await(fn(args, sample, **filter_kwargs_for(fn, kwargs)))
    if out is None:
        return sample
    if not isinstance(out, Sample):
        raise bad_return("rollout_sample_hook_path", fn, "a Sample or None", out)
    return out


def call_log_function(fn: Callable, *call_args) -> bool:
    """Call `--custom-rollout-log-function-path` / `--custom-eval-rollout-log-function-path` with
    slime's positional arguments; True means the default metrics are skipped."""
    return bool(fn(*call_args))


def call_buffer_filter(
    fn: Callable, args, rollout_id: int, buffer: list[list[Sample]], num_samples: int
) -> list[list[Sample]]:
    """Call `--buffer-filter-path`; the returned groups are removed from `buffer` (in place).

    Groups the user function already removed itself are tolerated (removal is by identity).
    """
    out = fn(args, rollout_id, buffer, num_samples)
    if not _is_group_list(out):
        raise bad_return("buffer_filter_path", fn, "list[list[Sample]]", out)
    taken = {id(g) for g in out}
    buffer[:] = [g for g in buffer if id(g) not in taken]
    return out


def call_reward_post_process(fn: Callable, args, samples: list[Sample]) -> tuple[list, list]:
    """Call `--custom-reward-post-process-path`; returns (raw_rewards, rewards), one per sample."""
    out = fn(args, samples)
    dest = "custom_reward_post_process_path"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise bad_return(dest, fn, "a (raw_rewards, rewards) pair", out)
    raw, rewards = out
    for value in (raw, rewards):
        if not isinstance(value, (list, tuple, torch.Tensor, np.ndarray)) or len(value) != len(
            samples
        ):
            raise bad_return(dest, fn, f"raw_rewards and rewards of length {len(samples)}", out)
    return raw, rewards


def call_convert_samples_to_train_data(fn: Callable, args, samples: list[Sample]) -> dict:
    """Call `--custom-convert-samples-to-train-data-path`; checks the required train-data keys."""
    out = fn(args, samples)
    dest = "custom_convert_samples_to_train_data_path"
    if not isinstance(out, dict):
        raise bad_return(dest, fn, "a dict", out)
    missing = [k for k in TRAIN_DATA_REQUIRED_KEYS if k not in out]
    if missing:
        raise KeyError(
            f"--custom-convert-samples-to-train-data-path function {function_path(fn)} returned "
            f"a dict without required key(s) {missing} (required: {list(TRAIN_DATA_REQUIRED_KEYS)})"
        )
    return out


def call_rollout_data_postprocess(fn: Callable, args, rollout_id: int, rollout_data: dict) -> None:
    """Call `--rollout-data-postprocess-path`, which mutates `rollout_data` in place."""
    out = fn(args, rollout_id, rollout_data)
    if out is not None and out is not rollout_data:
        raise bad_return("rollout_data_postprocess_path", fn, "None (mutate rollout_data)", out)


def call_custom_loss(
    fn: Callable, args, batch: dict, logits: torch.Tensor, sum_of_sample_mean: Callable
) -> tuple[torch.Tensor, dict]:
    """Call `--custom-loss-function-path`; returns (scalar loss tensor, log dict)."""
    out = fn(args, batch, logits, sum_of_sample_mean)
    if (
        not isinstance(out, (tuple, list))
        or len(out) != 2
        or not isinstance(out[0], torch.Tensor)
        or out[0].numel() != 1
        or not isinstance(out[1], dict)
    ):
        raise bad_return("custom_loss_function_path", fn, "(scalar loss tensor, dict)", out)
    return out[0], out[1]


def call_custom_advantage(fn: Callable, args, rollout_data: dict) -> None:
    """Call `--custom-advantage-function-path`; it must set `advantages` and `returns`."""
    fn(args, rollout_data)
    missing = [k for k in ("advantages", "returns") if k not in rollout_data]
    if missing:
        raise KeyError(
            f"--custom-advantage-function-path function {function_path(fn)} did not set "
            f"rollout_data{missing}"
        )


def call_custom_tis(
    fn: Callable,
    args,
    *,
    pg_loss: torch.Tensor,
    train_log_probs,
    rollout_log_probs,
    loss_masks,
    **kwargs,
) -> tuple[torch.Tensor, Any, dict]:
    """Call `--custom-tis-function-path` as slime does, everything by keyword (`args=args`);
    returns (pg_loss, loss masks, metrics dict)."""
    out = fn(
        args=args,
        pg_loss=pg_loss,
        train_log_probs=train_log_probs,
        rollout_log_probs=rollout_log_probs,
        loss_masks=loss_masks,
        **kwargs,
    )
    if (
        not isinstance(out, (tuple, list))
        or len(out) != 3
        or not isinstance(out[0], torch.Tensor)
        or not isinstance(out[2], dict)
    ):
        raise bad_return("custom_tis_function_path", fn, "(pg_loss tensor, masks, metrics dict)", out)
    return out[0], out[1], out[2]


def call_model_provider(fn: Callable, pre_process: bool, post_process: bool, vp_stage=None):
    """Call `--custom-model-provider-path`; `vp_stage=` is passed only if `fn` accepts it."""
    if accepts_kwarg(fn, "vp_stage"):
        out = fn(pre_process, post_process, vp_stage=vp_stage)
    else:
        out = fn(pre_process, post_process)
    if not isinstance(out, torch.nn.Module):
        raise bad_return("custom_model_provider_path", fn, "a torch.nn.Module (GPTModel)", out)
    return out


def call_megatron_init(fn: Callable, args) -> None:
    """Call `--custom-megatron-init-path` after Megatron's own initialisation."""
    out = fn(args)
    if out is not None:
        raise bad_return("custom_megatron_init_path", fn, "None", out)


def call_before_train_step_hook(
    fn: Callable, args, rollout_id: int, step_id: int, model, optimizer, opt_param_scheduler
) -> None:
    """Call `--custom-megatron-before-train-step-hook-path` before each optimizer step."""
    out = fn(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)
    if out is not None:
        raise bad_return("custom_megatron_before_train_step_hook_path", fn, "None", out)


def call_pg_loss_reducer_factory(fn: Callable, total_lengths, response_lengths, loss_masks,
                                 calculate_per_token_loss: bool) -> Callable:
    """Call the `--custom-pg-loss-reducer-function-path` factory with slime's positional arguments;
    returns its reducer, wrapped so that a non-scalar result raises a TypeError naming the flag."""
    dest = "custom_pg_loss_reducer_function_path"
    reducer = fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)
    if not callable(reducer):
        raise bad_return(dest, fn, "a reducer callable", reducer)

    def reduce(x: torch.Tensor) -> torch.Tensor:
        out = reducer(x)
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise bad_return(dest, fn, "a reducer returning a scalar tensor", out)
        return out

    return reduce


def call_before_log_prob_hook(fn: Callable, args, model, store_prefix: str) -> None:
    """Call `--custom-megatron-before-log-prob-hook-path` before a log-prob pass."""
    out = fn(args, model, store_prefix)
    if out is not None:
        raise bad_return("custom_megatron_before_log_prob_hook_path", fn, "None", out)


def call_update_weight_post_write(fn: Callable, args, version_dir: str, rollout_engines) -> None:
    """Call `--custom-update-weight-post-write-path` after the weights are written to disk."""
    out = fn(args, version_dir, rollout_engines)
    if out is not None:
        raise bad_return("custom_update_weight_post_write_path", fn, "None", out)


_DATA_SOURCE_METHODS = ("get_samples", "add_samples", "save", "load", "__len__")


def make_data_source(cls: Callable, args):
    """Instantiate `--data-source-path` as `cls(args)` and check it has the data-source methods."""
    out = cls(args)
    missing = [m for m in _DATA_SOURCE_METHODS if not callable(getattr(out, m, None))]
    if missing:
        raise TypeError(
            f"--data-source-path class {function_path(cls)} lacks method(s) {missing} "
            f"(documented: {PLUGIN_FLAGS['data_source_path']})"
        )
    return out


_CURRENT_ROLLOUT_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar("slime_rollout_id", default=None)


def set_current_rollout_id(rollout_id: int | None) -> None:
    """Record the rollout being generated (slime's `sample_hooks.set_current_rollout_id`)."""
    _CURRENT_ROLLOUT_ID.set(rollout_id)


def current_rollout_id() -> int | None:
    """The rollout id last set in this context (None before any rollout)."""
    return _CURRENT_ROLLOUT_ID.get()
