"""When the old-policy log-prob pass is redundant: the train step's forward gives its numbers bit for bit.

A rollout trained in ONE optimizer step sees the weights the old-policy pass would see, and when the
pass would pack the same micro-batches (same samples, same order, same token budget, the same
routing) the training forward's log-probs ARE the old policy's. `MegatronTrainer` then skips the
forward-only pass and the policy loss takes the training forward's log-probs, detached, as the old
ones (TRL's GRPOTrainer does the same with one step per generation).

Bit for bit, not "equal up to rounding": on CPU the no-grad eval-mode pass and the training forward
were compared with `torch.equal` on the tiny MoE and never differed: 2 gloo ranks with EP=2 (1-3
micro-batches per rank, dynamic or fixed), TP=2 with sequence parallel, PP=2, --balance-data,
full recompute, and the 6-rollout loop of scripts/run-tiny-moe-cpu.sh
(tests/distributed/test_old_policy_reuse.py keeps checking it). megatron-core 0.16's train-only
forward branches (dropout, the sinkhorn router) are excluded below (router input jitter, random in
every forward, is no flag of ours). The equality is not known on CUDA, where kernel choices can
depend on the grad mode (torch SDPA's backend filters, Transformer Engine's attention backends):
there the pass still runs.

`reuse_blocker` names the first condition that fails (None: the pass is skipped). Each condition
is a reader or a producer of the old log-probs that the skip would change.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def _size(args, name: str) -> int:
    return int(getattr(args, name, 1) or 1)


# (why the pass must run, predicate on args): the first true one blocks the skip
_BLOCKERS = (
    ("--loss-type is not policy_loss (a custom loss receives the old log-probs itself)",
     lambda a: a.loss_type != "policy_loss"),
    ("--kl-coef != 0: the advantages' KL penalty reads the old log-probs before the step",
     lambda a: a.kl_coef != 0),
    ("--custom-advantage-function-path may read the old log-probs", lambda a: bool(a.custom_advantage_function_path)),
    ("--rollout-data-postprocess-path may read or change the old log-probs",
     lambda a: bool(a.rollout_data_postprocess_path)),
    ("--use-opd: the distillation term reads the old log-probs", lambda a: bool(a.use_opd)),
    ("--custom-megatron-before-log-prob-hook-path runs before the old-policy pass",
     lambda a: bool(a.custom_megatron_before_log_prob_hook_path)),
    ("--custom-megatron-before-train-step-hook-path runs between the pass and the step (it may change the weights)",
     lambda a: bool(a.custom_megatron_before_train_step_hook_path)),
    ("routing replay: the pass records or replays a routing the step replays",
     lambda a: bool(a.use_routing_replay or getattr(a, "use_rollout_routing_replay", False))),
    ("--log-probs-max-tokens-per-gpu differs from --max-tokens-per-gpu: other micro-batches",
     lambda a: bool(a.use_dynamic_batch_size) and a.log_probs_max_tokens_per_gpu != a.max_tokens_per_gpu),
    ("dropout: the training forward drops what the eval pass keeps",
     lambda a: bool(a.attention_dropout) or bool(a.hidden_dropout)),
    ("the sinkhorn router routes differently in training",
     lambda a: getattr(a, "moe_router_load_balancing_type", None) == "sinkhorn"),
    ("pipeline or context parallelism (not covered by tests/distributed/test_old_policy_reuse.py)",
     lambda a: _size(a, "pipeline_model_parallel_size") > 1 or _size(a, "context_parallel_size") > 1),
)


def reuse_blocker(args, num_steps: int, on_cuda: bool) -> str | None:
    """Why the old-policy pass must run for a rollout of `num_steps` optimizer steps (None: its
    log-probs are the first training forward's, bit for bit, and it is skipped). The same answer on
    every rank (args and the step count are), so the ranks skip the pass's collectives together."""
    if args.disable_compute_advantages_and_returns or args.use_rollout_logprobs:
        return "no old-policy pass runs"
    if num_steps != 1:
        return f"{num_steps} optimizer steps per rollout: the later steps' weights are not the old policy's"
    if on_cuda:
        return "on CUDA (bit equality of the no-grad pass and the training forward is checked on CPU only)"
    for reason, blocks in _BLOCKERS:
        if blocks(args):
            return reason
    return None


def decide(args, num_steps: int, on_cuda: bool, previous: str | None, forced: bool = False) -> str | None:
    """`reuse_blocker`'s answer for this rollout (`forced`: the pass runs whatever it says), logged
    when it differs from the `previous` rollout's."""
    reason = "forced (reuse_train_log_probs is False)" if forced else reuse_blocker(args, num_steps, on_cuda)
    if reason != previous:
        logger.info("old-policy log-prob pass: %s", "skipped, the train step's forward gives its log-probs"
                    if reason is None else f"runs ({reason})")
    return reason
