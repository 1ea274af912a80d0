"""Every plugin flag that is set to a user's function imports, and its function accepts the call slime makes.

`CALLS` is the registry: dest -> how slime calls the function (positional arguments, keyword
arguments); a signature that cannot bind them is refused before start-up with the documented
signature (`slime.utils.plugin_signatures.PLUGIN_FLAGS`).
"""

from __future__ import annotations

import inspect

from slime.utils.plugin_signatures import PLUGIN_FLAGS
from slime.utils.preflight.report import Report

# dest -> (number of positional arguments, keyword arguments) of slime's call (slime.utils.plugins)
CALLS: dict[str, tuple[int, tuple[str, ...]]] = {
    "rollout_function_path": (3, ("evaluation",)),
    "eval_function_path": (3, ("evaluation",)),
    "custom_generate_function_path": (3, ()),
    "custom_rm_path": (2, ()),
    "dynamic_sampling_filter_path": (2, ()),
    "data_source_path": (1, ()),
    "buffer_filter_path": (4, ()),
    "custom_reward_post_process_path": (2, ()),
    "custom_convert_samples_to_train_data_path": (2, ()),
    "rollout_data_postprocess_path": (3, ()),
    "custom_loss_function_path": (4, ()),
    "custom_advantage_function_path": (2, ()),
    "custom_tis_function_path": (0, ("args", "pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks",
                                     "total_lengths", "response_lengths")),
    "custom_pg_loss_reducer_function_path": (4, ()),
    "custom_megatron_before_log_prob_hook_path": (3, ()),
    "custom_update_weight_post_write_path": (3, ()),
    "custom_model_provider_path": (2, ()),
    "custom_megatron_init_path": (1, ()),
    "custom_megatron_before_train_step_hook_path": (6, ()),
    "rollout_sample_filter_path": (2, ()),
    "rollout_all_samples_process_path": (3, ()),
    "custom_rollout_log_function_path": (5, ()),
    "custom_eval_rollout_log_function_path": (4, ()),
    "rollout_sample_hook_path": (2, ()),
}
# slime's own functions (the defaults of --rollout-function-path, --data-source-path, ...) are
# covered by its tests; importing them here would import torch and cost seconds.
OWN = "slime."


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _signature_problem(fn, dest: str) -> str | None:
    positional, keywords = CALLS[dest]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return None
    try:
        signature.bind(*([None] * positional), **{k: None for k in keywords})
    except TypeError as e:
        return f"{signature} cannot take slime's call ({e})"
    return None


def check_plugins(args, report: Report) -> None:
    """Import every set plugin path (`module.function`) and bind slime's call to its signature."""
    from slime.utils.misc import load_function

    for dest in CALLS:
        path = getattr(args, dest, None)
        if not path or not isinstance(path, str) or path.startswith(OWN):
            continue
        flag = _flag(dest)
        try:
            fn = load_function(path)
        except Exception as e:  # the user's module may raise anything while importing
            report.error(flag, f"{path}: cannot be imported ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                         "check the module is on PYTHONPATH and the function name")
            continue
        problem = _signature_problem(fn, dest)
        if problem:
            report.error(flag, f"{path}{problem}", f"documented: {PLUGIN_FLAGS[dest]}")
