"""The PPO critic (`--advantage-estimator ppo`): a value model trained next to the actor.

The value model is the actor's GPTModel stage (same architecture and parallel layout, built from
`critic_view(args)`) whose output layer is a `ValueHead`: one scalar per position instead of the
vocabulary's logits. The value of response token t is read where the actor's logits for token t
are read (the position before it), so values line up with log-probs token for token.

A rollout on the critic (driven by `slime.ray.critic.CriticSide`):
1. `compute_values`: forward-only values of every sample (each data-parallel rank its share,
   then gathered so that every rank, and the driver, holds all of them);
2. the actor trains with those values (GAE advantages, `slime.utils.advantages`);
3. `train`: returns from the same GAE (the KL penalty of the reward uses the actor's log-probs when
   the actor shares them: `--kl-coef` != 0 after the critic-only rollouts), then optimizer steps on
   the clipped value loss (`ppo_utils.compute_value_loss`, `--value-clip`).

The critic starts from `--critic-load` when it has a tracker file, else from `--ref-load`: every
weight but the output layer (the head starts fresh).
"""

from __future__ import annotations

import logging
from functools import partial

import torch

from slime.backends.megatron_utils import advantage_data
from slime.backends.megatron_utils import train_step as ts
from slime.backends.megatron_utils.actor import MegatronTrainer
from slime.backends.megatron_utils.logprobs import gather_context_parallel
from slime.backends.megatron_utils.model import build_train_state, unwrap
from slime.backends.megatron_utils.parallel import megatron_parallel_state as _mpu
from slime.backends.megatron_utils.sample_gather import gather_samples
from slime.utils.arguments.critic import critic_view
from slime.utils.losses import get_sum_of_sample_mean
from slime.utils.ppo_utils import compute_value_loss

logger = logging.getLogger(__name__)

CRITIC_KEYS = ("values", "returns")


class ValueHead(torch.nn.Module):
    """hidden [s, b, h] -> values [s, b, 1]; replaces GPTModel.output_layer (same call signature).

    Its weights are replicated over tensor parallelism; under sequence parallelism the hidden
    states are gathered first (and the gradient split back), as the output layer does."""

    def __init__(self, config):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, config.hidden_size, dtype=config.params_dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=config.params_dtype))
        config.init_method(self.weight.data)
        self.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden_states, self.weight, self.bias), None


def attach_value_head(model, config) -> None:
    """`build_bare_model` hook: the last pipeline stage's output layer becomes a ValueHead."""
    if getattr(model, "share_embeddings_and_output_weights", False):
        raise ValueError("the critic needs an untied output layer (critic_view sets --untie-embeddings-and-output-weights)")
    if model.post_process:
        model.output_layer = ValueHead(config)


def response_values(output: torch.Tensor, mb: ts.MicroBatch, cp_group=None) -> torch.Tensor:
    """output [1, T, 1] (this CP rank's row) -> flat values of every response token of `mb`,
    [sum(response_lengths)] in sample order, the same on every CP rank."""
    packed = mb.packed
    picked = output[0].index_select(0, packed.logit_index)[:, 0].float()
    return gather_context_parallel(picked, packed.flat_index, packed.num_response_tokens, cp_group)


def values_loss_fn(mb: ts.MicroBatch, output: torch.Tensor, *, cp_group=None):
    """Forward-only: report each sample's values."""
    values = response_values(output, mb, cp_group)
    split = list(mb.packed.response_lengths)
    out = {"sample_ids": mb.packed.sample_ids, "values": [t.detach().cpu() for t in values.split(split)]}
    return torch.zeros((), device=output.device), out


def value_train_loss_fn(mb: ts.MicroBatch, output: torch.Tensor, *, value_clip: float, per_token: bool,
                        scale: float, cp_group=None):
    """Clipped value loss of one micro-batch (slime's sample-mean reduction); metrics are sums
    over its samples: value_loss, value_clipfrac, values_mean, returns_mean."""
    values = response_values(output, mb, cp_group)
    old, returns = mb.tensors["values"], mb.tensors["returns"]
    losses, clipfrac = compute_value_loss(values, old, returns, value_clip)
    reduce = get_sum_of_sample_mean(mb.packed.total_lengths, mb.packed.response_lengths, mb.loss_masks, per_token)
    loss = reduce(losses)
    metrics = {"value_loss": loss, "value_clipfrac": reduce(clipfrac), "values_mean": reduce(values),
               "returns_mean": reduce(returns)}
    report = {"metrics": {k: v.detach().float() for k, v in metrics.items()}}
    return ts.megatron_loss_output(loss, mb, report, scale=scale, per_token=per_token)


class MegatronCritic(MegatronTrainer):
    """The value model of one critic rank: values, returns and value-loss steps."""

    def __init__(self, args):  # not super().__init__: that builds the actor's model
        self.args = critic_view(args)
        self.state = build_train_state(self.args, post_build=attach_value_head)
        self.ref_model = None
        self._hook = self._custom_loss = None
        self.step_id = 0

    def load_initial_state(self) -> int:
        """Resume from `--critic-load` (never silently ignored: only a first launch, `--critic-load`
        = `--critic-save` without a checkpoint yet, starts without it), else every weight but the
        value head from `--ref-load`. Returns the rollout id the critic's checkpoint continues from."""
        from slime.backends.megatron_utils.checkpoint import resumes

        args = self.args
        if resumes("--critic-load", args.load, args.save):
            return super().load_initial_state()
        if args.ref_load:
            load_backbone(args.ref_load, self.state.model[0])
            self.state.optimizer.reload_model_params()
        else:
            logger.warning("critic: no --critic-load checkpoint and no --ref-load: starting from random weights")
        return 0

    @torch.no_grad()
    def compute_values(self, rollout_data: dict) -> list[torch.Tensor]:
        """Values of every sample's response tokens ([response_len] each), on every rank."""
        mine = sorted(i for step in self.step_indices(rollout_data) for i in step)
        model = self.state.model[0]
        max_tokens = self.args.log_probs_max_tokens_per_gpu or self.args.max_tokens_per_gpu
        mbs = self._micro_batches(rollout_data, mine, max_tokens)
        model.eval()
        outputs = ts.run_schedule([model], mbs, partial(values_loss_fn, cp_group=_mpu().get_context_parallel_group()),
                                  forward_only=True)
        model.train()
        local = {i: v for out in outputs for i, v in zip(out["sample_ids"], out["values"])}
        values = gather_samples(local, len(rollout_data["tokens"]))
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            raise RuntimeError(f"critic: no values were computed for samples {missing[:8]}")
        return values

    def _fill_returns(self, rollout_data: dict, mine: list[int]) -> None:
        args = self.args
        _, rollout_data["returns"] = advantage_data.estimate(
            rollout_data, mine, "ppo", kl_coef=args.kl_coef, kl_loss_type=args.kl_loss_type,
            gamma=args.gamma, lambd=args.lambd)

    def train(self, rollout_id: int, rollout_data: dict) -> dict[str, float]:
        """One rollout's value-loss steps on `rollout_data` (which carries `values` from
        `compute_values`); returns `critic/` metrics averaged over the steps."""
        if "values" not in rollout_data:
            raise ValueError("critic.train needs rollout_data['values'] (from compute_values)")
        steps = self.step_indices(rollout_data)
        self._fill_returns(rollout_data, sorted(i for step in steps for i in step))
        per_step = [self._value_step(rollout_data, step) for step in steps]
        return {k: sum(m[k] for m in per_step) / len(per_step) for k in per_step[0]}

    def _value_step(self, rollout_data: dict, step: list[int]) -> dict[str, float]:
        args, state = self.args, self.state
        keys = CRITIC_KEYS if _mpu().is_pipeline_last_stage() else ()
        mbs = self._micro_batches(rollout_data, step, args.max_tokens_per_gpu, keys=keys)
        scale, norm = self._loss_scale(rollout_data, step, len(mbs))
        loss_fn = partial(value_train_loss_fn, value_clip=args.value_clip, per_token=args.calculate_per_token_loss,
                          scale=scale, cp_group=_mpu().get_context_parallel_group())
        for model in state.model:
            model.zero_grad_buffer()
        state.optimizer.zero_grad()
        outputs = ts.run_schedule(state.model, mbs, loss_fn, forward_only=False)
        lr = float(state.optimizer.param_groups[0]["lr"])
        ok, grad_norm, _ = state.optimizer.step()
        if ok:
            state.scheduler.step(increment=1)
        self.step_id += 1
        metrics = {k.replace("train/", "critic/", 1): v for k, v in ts.reduce_step_metrics(outputs, norm).items()}
        metrics["critic/grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        metrics["critic/lr"] = lr
        return metrics

    def save(self, rollout_id: int) -> None:
        """Checkpoint the critic under `--critic-save` (no HF export: it is not a language model)."""
        if self.args.save:
            super().save(rollout_id)


def load_backbone(load_dir, model) -> None:
    """Every weight of the actor's torch_dist checkpoint at `load_dir` except the output layer
    into the critic `model` (its value head keeps its fresh initialisation)."""
    from megatron.core import dist_checkpointing

    from slime.backends.megatron_utils.checkpoint import require_checkpoint
    from slime.backends.megatron_utils.torch_dist import iteration_dir, read_tracker

    require_checkpoint("--ref-load", load_dir)  # the critic starts from the actor's torch_dist checkpoint
    iteration = read_tracker(load_dir)
    bare = unwrap(model)
    sharded = {k: v for k, v in bare.sharded_state_dict().items() if not k.startswith("output_layer.")}
    loaded = dist_checkpointing.load({"model": sharded}, str(iteration_dir(load_dir, iteration)))
    missing, unexpected = bare.load_state_dict(loaded["model"], strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state") and not k.startswith("output_layer.")]
    if missing or unexpected:
        raise RuntimeError(f"critic from {load_dir}: missing keys {missing}, unexpected keys {unexpected}")
    logger.info("critic: backbone loaded from %s (iteration %s), value head initialised fresh", load_dir, iteration)
