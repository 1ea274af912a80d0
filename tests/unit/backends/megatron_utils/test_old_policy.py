"""old_policy.reuse_blocker: the old-policy pass is skipped only when every condition proving it
redundant holds, and each failing condition alone keeps it (naming why)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slime.backends.megatron_utils.old_policy import reuse_blocker


def _args(**overrides) -> SimpleNamespace:
    """The flags of scripts/run-tiny-moe-cpu.sh that the decision reads (the pass is redundant)."""
    base = dict(
        disable_compute_advantages_and_returns=False, use_rollout_logprobs=False, loss_type="policy_loss",
        kl_coef=0.0, custom_advantage_function_path=None, rollout_data_postprocess_path=None, use_opd=False,
        custom_megatron_before_log_prob_hook_path=None, custom_megatron_before_train_step_hook_path=None,
        use_routing_replay=False, use_rollout_routing_replay=False, use_dynamic_batch_size=True,
        max_tokens_per_gpu=2048, log_probs_max_tokens_per_gpu=2048, attention_dropout=0.0, hidden_dropout=0.0,
        moe_router_load_balancing_type="aux_loss", pipeline_model_parallel_size=1, context_parallel_size=1,
    )
    base.update(overrides)
    return SimpleNamespace(**base)


def test_redundant_pass_is_skipped():
    assert reuse_blocker(_args(), num_steps=1, on_cuda=False) is None
    # fixed micro-batches read --micro-batch-size in both passes: the token budgets do not matter
    assert reuse_blocker(_args(use_dynamic_batch_size=False, log_probs_max_tokens_per_gpu=64), 1, False) is None


@pytest.mark.parametrize("overrides, words", [
    (dict(disable_compute_advantages_and_returns=True), "no old-policy pass"),
    (dict(use_rollout_logprobs=True), "no old-policy pass"),
    (dict(loss_type="custom_loss"), "--loss-type"),
    (dict(loss_type="sft_loss"), "--loss-type"),
    (dict(kl_coef=0.1), "--kl-coef"),
    (dict(custom_advantage_function_path="m.f"), "--custom-advantage-function-path"),
    (dict(rollout_data_postprocess_path="m.f"), "--rollout-data-postprocess-path"),
    (dict(use_opd=True), "--use-opd"),
    (dict(custom_megatron_before_log_prob_hook_path="m.f"), "before-log-prob-hook"),
    (dict(custom_megatron_before_train_step_hook_path="m.f"), "before-train-step-hook"),
    (dict(use_routing_replay=True), "routing replay"),
    (dict(use_rollout_routing_replay=True), "routing replay"),
    (dict(log_probs_max_tokens_per_gpu=1024), "--log-probs-max-tokens-per-gpu"),
    (dict(attention_dropout=0.1), "dropout"),
    (dict(hidden_dropout=0.1), "dropout"),
    (dict(moe_router_load_balancing_type="sinkhorn"), "sinkhorn"),
    (dict(pipeline_model_parallel_size=2), "pipeline or context"),
    (dict(context_parallel_size=2), "pipeline or context"),
])
def test_each_failing_condition_keeps_the_pass(overrides, words):
    reason = reuse_blocker(_args(**overrides), num_steps=1, on_cuda=False)
    assert reason is not None and words in reason, reason


def test_several_steps_or_cuda_keep_the_pass():
    assert "2 optimizer steps" in reuse_blocker(_args(), num_steps=2, on_cuda=False)
    assert "CUDA" in reuse_blocker(_args(), num_steps=1, on_cuda=True)
