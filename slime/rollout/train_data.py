"""From finished samples to the train-data dict the trainer consumes, plus rollout metrics.

The dict has slime's keys (`tokens, response_lengths, rewards, raw_reward, truncated,
sample_indices, loss_masks` and, when every sample has them, `rollout_log_probs`). Reward
post-processing (GRPO group normalisation) happens here, once, on the rollout side;
`--custom-reward-post-process-path` and `--custom-convert-samples-to-train-data-path` replace the
two steps.
"""

from __future__ import annotations

import statistics

from slime.utils import advantages
from slime.utils.misc import load_function
from slime.utils.plugins import call_log_function
from slime.utils.types import Sample


def post_process_rewards(args, samples: list[Sample]) -> tuple[list[float], list[float]]:
    """(raw rewards, rewards used for advantages). Groups are `--n-samples-per-prompt` long and
    consecutive; the normalisation rules live in `slime.utils.advantages.post_process_rewards`."""
    raw = [float(s.get_reward_value(args)) for s in samples]
    n = args.n_samples_per_prompt
    if len(raw) % n:
        raise ValueError(
            f"{len(raw)} samples are not whole groups of --n-samples-per-prompt {n}; "
            "a dynamic filter or custom rollout returned a partial group"
        )
    rewards = advantages.post_process_rewards(
        raw,
        estimator=args.advantage_estimator,
        n_samples_per_prompt=n,
        rewards_normalization=not args.disable_rewards_normalization,
        grpo_std_normalization=not args.disable_grpo_std_normalization,
    )
    return raw, rewards.tolist()


def samples_to_train_data(args, samples: list[Sample], rewards_fn=post_process_rewards) -> dict:
    """Flatten samples into per-sample lists. A sample with `remove_sample` keeps its place (so
    groups stay aligned) but gets an all-zero loss mask."""
    raw, rewards = rewards_fn(args, samples)
    data = {
        "tokens": [list(s.tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": [int(s.status == Sample.Status.TRUNCATED) for s in samples],
        "sample_indices": [s.index for s in samples],
        "loss_masks": [_loss_mask(s) for s in samples],
    }
    if samples and all(s.rollout_log_probs is not None for s in samples):
        data["rollout_log_probs"] = [list(s.rollout_log_probs) for s in samples]
    if samples and all(s.rollout_routed_experts is not None for s in samples):
        data["rollout_routed_experts"] = [s.rollout_routed_experts for s in samples]
    if any(s.teacher_log_probs is not None for s in samples):
        data["teacher_log_probs"] = [s.teacher_log_probs for s in samples]
    return data


def _loss_mask(sample: Sample) -> list[int]:
    mask = list(sample.loss_mask) if sample.loss_mask is not None else [1] * sample.response_length
    if len(mask) != sample.response_length:
        raise ValueError(
            f"sample {sample.index}: loss_mask has {len(mask)} entries but response_length is "
            f"{sample.response_length}"
        )
    return [0] * len(mask) if sample.remove_sample else mask


def rollout_metrics(args, samples: list[Sample], seconds: float) -> dict[str, float]:
    """Reward mean/std, response length, truncation and throughput of one rollout."""
    if not samples:
        return {}
    raw = [float(s.get_reward_value(args)) for s in samples]
    lengths = [s.response_length for s in samples]
    return {
        "rollout/raw_reward": statistics.fmean(raw),
        "rollout/raw_reward_std": statistics.pstdev(raw),
        "rollout/response_len_mean": statistics.fmean(lengths),
        "rollout/response_len_max": float(max(lengths)),
        "rollout/truncated_ratio": statistics.fmean(s.status == Sample.Status.TRUNCATED for s in samples),
        "rollout/num_samples": float(len(samples)),
        "perf/rollout_time": seconds,
        "perf/rollout_tokens_per_s": sum(lengths) / seconds if seconds > 0 else 0.0,
    }


def logged_rollout_metrics(args, rollout_id: int, samples: list[Sample], extra_metrics: dict,
                           seconds: float) -> dict[str, float]:
    """The rollout's metrics: the defaults plus the rollout function's own, unless
    `--custom-rollout-log-function-path` returns True, which keeps only the perf/* timings."""
    metrics = {**rollout_metrics(args, samples, seconds), **extra_metrics}
    path = getattr(args, "custom_rollout_log_function_path", None)
    if path and call_log_function(load_function(path), rollout_id, args, samples, extra_metrics, seconds):
        metrics = {k: v for k, v in metrics.items() if k.startswith("perf/")}
    return metrics
