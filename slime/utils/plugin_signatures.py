"""The documented signature of every plugin flag (docs/slime-compat.md §3), and the TypeError
raised when a user function's return does not match it.

`PLUGIN_FLAGS` maps each flag's argparse dest to its documented signature (used by tests and docs).
Split out of `slime.utils.plugins`, which re-exports `PLUGIN_FLAGS`.
"""

from __future__ import annotations

from typing import Any, Callable

from slime.utils.misc import function_path

PLUGIN_FLAGS: dict[str, str] = {
    "rollout_function_path": "generate_rollout(args, rollout_id, data_source, evaluation=False)"
    " -> RolloutFnTrainOutput | list[list[Sample]]",
    "eval_function_path": "generate_rollout(args, rollout_id, data_source, evaluation=True)"
    " -> RolloutFnEvalOutput | dict[str, dict]",
    "custom_generate_function_path": "async generate(args, sample, sampling_params"
    "[, evaluation=False]) -> Sample | list[Sample]",
    "custom_rm_path": "async rm(args, sample) -> float | dict; with --group-rm:"
    " async rm(args, samples) -> list[float | dict]",
    "dynamic_sampling_filter_path": "filter(args, samples, **kwargs) -> DynamicFilterOutput | bool",
    "data_source_path": "class DataSource(args) with get_samples(num), add_samples(groups),"
    " save(rollout_id), load(rollout_id=None), __len__()",
    "buffer_filter_path": "fn(args, rollout_id, buffer, num_samples) -> list[list[Sample]]",
    "custom_reward_post_process_path": "fn(args, samples) -> (raw_rewards, rewards)",
    "custom_convert_samples_to_train_data_path": "fn(args, samples) -> dict",
    "rollout_data_postprocess_path": "fn(args, rollout_id, rollout_data) -> None",
    "custom_loss_function_path": "fn(args, batch, logits, sum_of_sample_mean) -> (loss, log_dict)",
    "custom_advantage_function_path": "fn(args, rollout_data) -> None"
    " (sets rollout_data['advantages'] and ['returns'])",
    "custom_tis_function_path": "fn(*, args, pg_loss, train_log_probs, rollout_log_probs,"
    " loss_masks, total_lengths, response_lengths) -> (pg_loss, masks, metrics); with --use-tis",
    "custom_pg_loss_reducer_function_path": "factory(total_lengths, response_lengths, loss_masks,"
    " calculate_per_token_loss) -> reducer(x) -> scalar; reduces the pg_loss only",
    "custom_megatron_before_log_prob_hook_path": "fn(args, model, store_prefix) -> None;"
    " store_prefix '' (old policy) or 'ref_' (reference)",
    "custom_update_weight_post_write_path": "hook(args, version_dir, rollout_engines) -> None;"
    " after a disk weight write, before the engines load it",
    "custom_model_provider_path": "fn(pre_process, post_process, vp_stage=None) -> GPTModel",
    "custom_megatron_init_path": "fn(args) -> None",
    "custom_megatron_before_train_step_hook_path": "fn(args, rollout_id, step_id, model,"
    " optimizer, opt_param_scheduler) -> None",
    "rollout_sample_filter_path": "fn(args, groups) -> None (may set sample.remove_sample)",
    "rollout_all_samples_process_path": "fn(args, all_groups, get_samples) -> None",
    "custom_rollout_log_function_path": "fn(rollout_id, args, samples, extra_metrics, rollout_time)"
    " -> bool (True: skip the default rollout metrics)",
    "custom_eval_rollout_log_function_path": "fn(rollout_id, args, data, extra_metrics) -> bool"
    " (True: skip the default eval metrics)",
    "rollout_sample_hook_path": "hook(args, sample[, rollout_id=, evaluation=]) -> Sample | None"
    " (sync or async; given only the keywords it declares)",
}


def bad_return(dest: str, fn: Callable, expected: str, got: Any) -> TypeError:
    """A TypeError naming the flag, the user function, what was expected and what came back."""
    flag = "--" + dest.replace("_", "-")
    shown = repr(got)
    shown = shown if len(shown) <= 200 else shown[:200] + "..."
    return TypeError(
        f"{flag} function {function_path(fn)} must return {expected}; "
        f"got {type(got).__name__}: {shown} (documented: {PLUGIN_FLAGS[dest]})"
    )
