"""The Megatron trainer of one rank: log-probs, advantages, optimizer steps, metrics.

`MegatronTrainer.train(rollout_id, rollout_data)` runs slime's step: split the rollout into
global batches and, per batch, this data-parallel rank's samples; compute old (and reference)
log-probs with forward-only passes (the old-policy pass is skipped when the train step's forward
gives its log-probs bit for bit, `old_policy.reuse_blocker`); advantages and returns; then for
each global batch pack micro-batches (fixed `--micro-batch-size` or dynamic by
`--max-tokens-per-gpu`), run megatron's forward-backward schedule and step the optimizer and LR
schedule. Every rank receives the whole `rollout_data` dict and picks its share
deterministically, so layouts agree by construction.
"""

from __future__ import annotations

import logging
import time
from functools import partial

import torch

from slime.backends.megatron_utils import advantage_data, collectives, old_policy, opd, routing_replay
from slime.backends.megatron_utils import train_step as ts
from slime.backends.megatron_utils.model import build_reference_model, build_train_state, unwrap
from slime.backends.megatron_utils.parallel import megatron_parallel_state as _mpu
from slime.backends.megatron_utils.data_split import DataSplitMixin
from slime.backends.megatron_utils.sample_gather import gather_kl_inputs, local_kl_inputs
from slime.utils.plugins import (call_before_log_prob_hook, call_before_train_step_hook, call_custom_advantage,
                                 call_custom_loss, call_rollout_data_postprocess)
from slime.utils.advantages import advantage_options_from_args
from slime.utils.losses import get_loss_function, get_sum_of_sample_mean, loss_options_from_args
from slime.utils.misc import load_function

logger = logging.getLogger(__name__)

PER_TOKEN_KEYS = ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "returns")


class MegatronTrainer(DataSplitMixin):
    """Model, optimizer and schedule of this rank plus the train/log-prob logic."""

    _pending_save = None  # --async-save: a checkpoint being written in the background (subclasses too)
    _host_reference = None  # reference.HostReference once the reference model's weights moved to the host
    _host_teacher = None  # --opd-type megatron: the teacher's weights on the host (loaded in load_initial_state)
    # the old-policy pass is skipped when provably redundant (old_policy.py); False forces it (tests)
    reuse_train_log_probs = True
    _reuse_reason: str | None = ""  # this rollout's decision: None = skipped, else why the pass runs ("": none yet)

    def __init__(self, args, with_ref: bool | None = None):
        self.args = args
        self.state = build_train_state(args)
        needs_ref = args.use_kl_loss or args.kl_coef != 0
        self.ref_model = build_reference_model(args) if (needs_ref if with_ref is None else with_ref) else None
        self._hook = load_function(args.custom_megatron_before_train_step_hook_path) \
            if args.custom_megatron_before_train_step_hook_path else None
        self._custom_loss = load_function(args.custom_loss_function_path) if args.loss_type == "custom_loss" else None
        self._log_prob_hook = load_function(args.custom_megatron_before_log_prob_hook_path) \
            if args.custom_megatron_before_log_prob_hook_path else None
        self.step_id = 0

    # ----- log-probs ---------------------------------------------------------------------
    @torch.no_grad()
    def compute_log_prob(self, rollout_data: dict, indices: list[int], model=None, with_entropy=False,
                         routing: str | None = None, micro_batches: list | None = None) -> dict | None:
        """Response log-probs (and entropy) of `indices` under `model` (default: the actor).
        Returns {sample index: tensor} on the last pipeline stage, None elsewhere. `routing`
        (with --use-routing-replay): "replay" rollout_data[REPLAY_KEY], "record" this pass's
        routing into it, else the routers route themselves. `micro_batches`: those
        `log_prob_micro_batches` built for `indices` and `routing` (reused across passes)."""
        model = model if model is not None else self.state.model[0]
        mbs = micro_batches if micro_batches is not None else self.log_prob_micro_batches(rollout_data, indices, routing)
        loss_fn = partial(ts.log_prob_loss_fn, **self._logprob_kw(with_entropy))
        model.eval()
        outputs = ts.run_schedule([model], mbs, loss_fn, forward_only=True)
        model.train()
        if routing == "record":
            mpu = _mpu()
            sp_group = mpu.get_tensor_model_parallel_group() if self.state.config.sequence_parallel else None
            routing_replay.keep_recorded(rollout_data, mbs, cp_rank=mpu.get_context_parallel_rank(),
                                         cp_size=mpu.get_context_parallel_world_size(), sp_group=sp_group)
        if not _mpu().is_pipeline_last_stage():
            return None
        result = {"log_probs": {}, "entropy": {}}
        for out in outputs:
            for k, i in enumerate(out["sample_ids"]):
                result["log_probs"][i] = out["log_probs"][k]
                if "entropy" in out:
                    result["entropy"][i] = out["entropy"][k]
        return result

    def log_prob_micro_batches(self, rollout_data: dict, indices: list[int], routing: str | None = None) -> list:
        """The packed micro-batches of the forward-only log-prob passes (--log-probs-max-tokens-per-gpu)."""
        max_tokens = self.args.log_probs_max_tokens_per_gpu or self.args.max_tokens_per_gpu
        return self._micro_batches(rollout_data, indices, max_tokens, routing=routing)

    def _logprob_kw(self, with_entropy: bool) -> dict:
        """Keywords of `train_step.response_log_probs`. The entropy keeps its autograd graph only
        when a loss can train on it (--entropy-coef != 0, or a custom loss); else it is reported only."""
        entropy_grad = self.args.entropy_coef != 0 or getattr(self, "_custom_loss", None) is not None
        return dict(tp_group=_mpu().get_tensor_model_parallel_group(), temperature=self.args.rollout_temperature,
                    with_entropy=with_entropy, vocab_size=self.args.vocab_size, entropy_grad=entropy_grad,
                    cp_group=_mpu().get_context_parallel_group(), chunk_size=self.args.log_probs_chunk_size)

    def _fill_log_probs(self, rollout_data: dict, mine: list[int]) -> None:
        """Add per-sample `log_probs` (and `ref_log_probs`) lists to rollout_data for `mine`.
        `--disable-compute-advantages-and-returns` skips the old-policy pass (only the policy loss
        and the advantages read it); so does `_reuse_old` (its log-probs are the train step's,
        old_policy.py). `--custom-megatron-before-log-prob-hook-path` runs before each
        pass that runs: store_prefix "" (old policy), "ref_" (the actor's chunks holding the reference
        weights, swapped in from the host) or "teacher_" (--opd-type megatron: the teacher's weights
        swapped in the same way; its log-probs go to `teacher_log_probs`)."""
        n = len(rollout_data["tokens"])
        routing = routing_replay.old_policy_routing(self.args, rollout_data)
        old_pass = not (self.args.disable_compute_advantages_and_returns or self.args.use_rollout_logprobs
                        or self._reuse_old)
        # packed once for both passes, unless routing replay attaches a different routing to each
        share = old_pass and self.has_reference and not self.args.use_routing_replay
        mbs = self.log_prob_micro_batches(rollout_data, mine) if share else None
        if self.args.disable_compute_advantages_and_returns or self._reuse_old:
            pass
        elif self.args.use_rollout_logprobs:
            rollout_data["log_probs"] = [torch.as_tensor(x) for x in rollout_data["rollout_log_probs"]]
        else:
            self._before_log_prob("", self.state.model)
            got = self.compute_log_prob(rollout_data, mine, routing=routing, micro_batches=mbs)
            if got is not None:
                rollout_data["log_probs"] = [got["log_probs"].get(i) for i in range(n)]
        if self.has_reference:
            got = self.compute_reference_log_prob(rollout_data, mine, micro_batches=mbs)
            if got is not None:
                rollout_data["ref_log_probs"] = [got["log_probs"].get(i) for i in range(n)]
        if self._host_teacher is not None:
            with self._host_teacher.swapped_into(self.state.model[0]):
                self._before_log_prob("teacher_", self.state.model)
                got = self.compute_log_prob(rollout_data, mine, micro_batches=mbs)
            if got is not None:
                rollout_data[opd.TEACHER_KEY] = [got["log_probs"].get(i) for i in range(n)]

    @property
    def has_reference(self) -> bool:
        """True when the run has a reference model (--use-kl-loss or --kl-coef)."""
        return self.ref_model is not None or self._host_reference is not None

    def host_reference(self):
        """The reference weights on the host (`reference.HostReference`); the reference model built
        at start-up (loaded by `load_initial_state`) is turned into it on first use and freed."""
        if self.ref_model is not None:
            from slime.backends.megatron_utils.reference import HostReference

            self._host_reference, self.ref_model = HostReference.from_module(self.ref_model), None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return self._host_reference

    def compute_reference_log_prob(self, rollout_data: dict, indices: list[int], micro_batches: list | None = None):
        """`compute_log_prob` under the reference weights, swapped into the actor from the host (one
        model on the device, as slime does); the actor's weights come back bit for bit. The
        before-log-prob hook sees the actor's chunks holding the reference weights."""
        with self.host_reference().swapped_into(self.state.model[0]):
            self._before_log_prob("ref_", self.state.model)
            return self.compute_log_prob(rollout_data, indices, micro_batches=micro_batches)

    def _before_log_prob(self, store_prefix: str, model: list) -> None:
        if getattr(self, "_log_prob_hook", None) is not None:
            call_before_log_prob_hook(self._log_prob_hook, self.args, model, store_prefix)

    # ----- advantages ----------------------------------------------------------------------
    def _fill_advantages(self, rollout_data: dict, mine: list[int]) -> None:
        """Per-sample advantages/returns for `mine` (last pipeline stage: the only one that
        computes the loss). `--custom-advantage-function-path` replaces the estimator;
        `--normalize-advantages` then whitens the advantages (the estimator's or the plugin's)
        over the data-parallel batch. `--use-opd` subtracts `--opd-kl-coef` times the per-token
        reverse KL to the teacher before the whitening. `--disable-compute-advantages-and-returns`: none."""
        if not _mpu().is_pipeline_last_stage() or self.args.disable_compute_advantages_and_returns:
            return
        if self.args.custom_advantage_function_path:
            call_custom_advantage(load_function(self.args.custom_advantage_function_path), self.args, rollout_data)
        else:
            self._estimate_advantages(rollout_data, mine)
        if self.args.use_opd:
            opd.add_distillation(rollout_data, mine, self.args.opd_kl_coef)
        if self.args.normalize_advantages:
            advantage_data.whiten_advantages(rollout_data, mine, _mpu().get_data_parallel_group())

    def _estimate_advantages(self, rollout_data: dict, mine: list[int]) -> None:
        opts = advantage_options_from_args(self.args)
        estimator = opts.pop("estimator")
        opts["normalize_advantages"] = False  # whitened over data parallel by the caller
        rollout_data["advantages"], rollout_data["returns"] = advantage_data.estimate(
            rollout_data, mine, estimator, **opts)

    # ----- loss ---------------------------------------------------------------------------
    def _compute_loss(self, mb, log_probs, entropy, logits):
        args, t = self.args, mb.tensors
        lengths = mb.packed.response_lengths
        if self._custom_loss is not None:
            batch = {"log_probs": log_probs, "entropy": entropy, "loss_masks": mb.loss_masks,
                     "response_lengths": lengths, "total_lengths": mb.packed.total_lengths, **t}
            reducer = get_sum_of_sample_mean(mb.packed.total_lengths, lengths, mb.loss_masks,
                                             args.calculate_per_token_loss)
            return call_custom_loss(self._custom_loss, args, batch, logits, reducer)
        fn, opts = get_loss_function(args.loss_type), loss_options_from_args(args.loss_type, args)
        common = dict(loss_masks=mb.loss_masks, response_lengths=lengths, total_lengths=mb.packed.total_lengths)
        if args.loss_type == "sft_loss":
            return fn(log_probs=log_probs, **common, **opts)
        old_log_probs = log_probs.detach() if self._reuse_old else t["log_probs"]
        return fn(log_probs=log_probs, old_log_probs=old_log_probs, advantages=t["advantages"],
                  ref_log_probs=t.get("ref_log_probs"), entropy=entropy,
                  rollout_log_probs=t.get("rollout_log_probs"), **common, **opts)

    def _loss_scale(self, rollout_data: dict, step: list[int], num_mbs: int) -> tuple[float, float]:
        """(scale of each micro-batch loss, normaliser of summed metrics) for one global batch."""
        mpu = _mpu()
        dp = mpu.get_data_parallel_world_size()
        if self.args.calculate_per_token_loss:
            tokens = collectives.device_tensor(float(sum(sum(rollout_data["loss_masks"][i]) for i in step)))
            norm = max(float(collectives.all_reduce(tokens, group=mpu.get_data_parallel_group())), 1.0)
        else:
            norm = float(self.args.global_batch_size)
        return num_mbs * dp / norm, norm

    # ----- train --------------------------------------------------------------------------
    def train(self, rollout_id: int, rollout_data: dict) -> dict[str, float]:
        """One rollout's optimizer steps. Returns namespaced metrics averaged over the steps
        (same dict on every rank)."""
        start = time.monotonic()
        self.finish_pending_save()  # --async-save: the previous checkpoint was written meanwhile
        steps = self.step_indices(rollout_data)
        mine = sorted(i for step in steps for i in step)
        self._reuse_reason = old_policy.decide(self.args, len(steps), torch.cuda.is_available(), self._reuse_reason,
                                               forced=not self.reuse_train_log_probs)  # the same on every rank
        self._fill_log_probs(rollout_data, mine)
        log_probs_seconds = time.monotonic() - start
        opd_metrics = self._opd_metrics(rollout_data, mine) if self.args.use_opd else {}
        if self.args.advantage_estimator == "ppo" and self.args.kl_coef != 0:  # for the critic's returns
            self._kl_inputs = local_kl_inputs(rollout_data, mine)
        self._fill_advantages(rollout_data, mine)
        if self.args.rollout_data_postprocess_path:  # slime's call site: after log-probs and advantages
            call_rollout_data_postprocess(load_function(self.args.rollout_data_postprocess_path), self.args,
                                          rollout_id, rollout_data)
        self._rollout_first_step = self.step_id  # the before-train-step hook counts steps within the rollout
        per_step = [self._train_one_step(rollout_id, rollout_data, step) for step in steps]
        metrics = {k: sum(m[k] for m in per_step) / len(per_step) for k in per_step[0]}
        metrics.update(opd_metrics)
        metrics["perf/log_probs_time"] = log_probs_seconds  # ref / old-policy / teacher forward passes
        tokens = collectives.device_tensor(float(sum(len(rollout_data["tokens"][i]) for i in mine)))
        tokens = float(collectives.all_reduce(tokens, group=_mpu().get_data_parallel_group()))
        seconds = time.monotonic() - start
        metrics["perf/train_time"] = seconds
        metrics["perf/train_tokens_per_s"] = tokens / seconds if seconds > 0 else 0.0
        interval = self.args.ref_update_interval
        if interval and self.has_reference and (rollout_id + 1) % interval == 0:
            self.update_reference_model()
        return metrics

    @property
    def _reuse_old(self) -> bool:
        """This rollout's loss takes the training forward's log-probs, detached, as the old ones."""
        return self._reuse_reason is None

    def _opd_metrics(self, rollout_data: dict, mine: list[int]) -> dict[str, float]:
        mpu = _mpu()
        return opd.reverse_kl_metric(rollout_data, mine, mpu.is_pipeline_last_stage(),
                                     mpu.get_data_parallel_group(), mpu.get_pipeline_model_parallel_group(),
                                     mpu.get_pipeline_model_parallel_last_rank())

    def update_reference_model(self) -> None:
        """The reference takes the actor's current weights (`--ref-update-interval`, after the steps
        of every N-th rollout, as slime does)."""
        self.host_reference().refresh_from(self.state.model[0])
        logger.info("reference model refreshed from the actor (--ref-update-interval %d)", self.args.ref_update_interval)

    def _train_one_step(self, rollout_id: int, rollout_data: dict, step: list[int]) -> dict[str, float]:
        args, state = self.args, self.state
        if self._hook is not None:
            call_before_train_step_hook(self._hook, args, rollout_id, self.step_id - self._rollout_first_step, state.model,
                                        state.optimizer, state.scheduler)
        keys = PER_TOKEN_KEYS if _mpu().is_pipeline_last_stage() else ()
        mbs = self._micro_batches(rollout_data, step, args.max_tokens_per_gpu, keys=keys, routing="replay")
        scale, norm = self._loss_scale(rollout_data, step, len(mbs))
        loss_fn = partial(ts.train_loss_fn, compute_loss=self._compute_loss, scale=scale,
                          per_token=args.calculate_per_token_loss, check_finite=args.check_for_nan_in_loss_and_grad,
                          **self._logprob_kw(with_entropy=True))  # entropy is always reported
        for model in state.model:
            model.zero_grad_buffer()
        state.optimizer.zero_grad()
        outputs = ts.run_schedule(state.model, mbs, loss_fn, forward_only=False)
        lr = float(state.optimizer.param_groups[0]["lr"])  # the rate this step uses
        ok, grad_norm, _ = state.optimizer.step()
        if ok:
            state.scheduler.step(increment=1)
        self.step_id += 1
        metrics = ts.reduce_step_metrics(outputs, norm)
        metrics["train/grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        metrics["train/lr"] = lr
        metrics["train/skipped_step"] = float(not ok)
        return metrics

    def ppo_kl_inputs(self, num_samples: int) -> dict:
        """ppo with --kl-coef: the last trained rollout's log_probs / ref_log_probs of all
        `num_samples` samples (collective over all ranks), for the critic's returns."""
        return gather_kl_inputs(getattr(self, "_kl_inputs", {}), num_samples)

    # ----- checkpoints ----------------------------------------------------------------------
    def load_initial_state(self) -> int:
        """Resume from `--load` or start from `--ref-load` (see `checkpoint.load_initial_state`);
        the reference model gets `--ref-load`'s weights. Returns the rollout id to start from."""
        from slime.backends.megatron_utils import checkpoint

        start, common = checkpoint.load_initial_state(self.args, self.state, self.ref_model)
        if self.args.use_opd and self.args.opd_type == "megatron":
            self._host_teacher = opd.load_host_teacher(self.args, partial(build_reference_model, self.args))
        if self.has_reference:
            self.host_reference()  # loaded: its weights go to the host, the device copy is freed
        self.step_id = int(common.get("step_id", 0))
        return start

    def save(self, rollout_id: int) -> None:
        """Checkpoint `iter_{rollout_id:07d}` under `--save` (optimizer unless --no-save-optim) and,
        with `--save-hf`, HF safetensors of the current weights. With `--async-save` the files are
        written in the background while the run goes on (weight sync, the next rollout); the save
        is finished at the next `train` or `save` call, and at once after the last rollout."""
        from slime.backends.megatron_utils import checkpoint

        args = self.args
        self.finish_pending_save()
        if args.save:
            out = checkpoint.save_checkpoint(args.save, rollout_id, self.state, rollout_id=rollout_id, args=args,
                                             save_optim=not args.no_save_optim, extra={"step_id": self.step_id},
                                             background=bool(args.async_save))
            if args.async_save:
                self._pending_save = out
                if args.num_rollout is None or rollout_id + 1 >= args.num_rollout:
                    self.finish_pending_save()  # the run ends here: nothing left to overlap with
        if args.save_hf:
            checkpoint.save_hf(args, self.state.model[0], rollout_id)

    def finish_pending_save(self) -> None:
        """Complete a background (`--async-save`) checkpoint, if one is being written (collective)."""
        pending, self._pending_save = self._pending_save, None
        if pending is not None:
            pending.finalize()

    @property
    def model(self):
        """The unwrapped GPTModel of this rank (for weight export and tests)."""
        return unwrap(self.state.model[0])

    # ----- memory hand-over (--offload-train) ------------------------------------------------
    @property
    def memory(self):
        """This rank's `TrainerMemory` (model chunks and optimizer; the reference weights are on the host)."""
        if getattr(self, "_memory", None) is None:
            from slime.backends.megatron_utils.offload import TrainerMemory

            if self.has_reference:
                self.host_reference()  # the reference lives on the host: nothing of it to offload
            self._memory = TrainerMemory(self.state.model, self.state.optimizer)
        return self._memory

    def offload(self, tags) -> dict[str, float]:
        """Give back the device memory of `tags` (weights, optimizer, grads); see offload.py."""
        return self.memory.offload(tags)

    def onload(self, tags) -> dict[str, float]:
        """Take back the memory of `tags`; training continues bit for bit."""
        return self.memory.onload(tags)

    def memory_held(self, phase: str) -> dict[str, float]:
        """`perf/train_held_gib_<phase>`: GiB the trainer's tensors hold on the device now (and,
        on GPUs, the allocator's figures)."""
        held = sum(self.memory.held_bytes().values()) / 2**30
        return {f"perf/train_held_gib_{phase}": held, **self.memory.device_memory()}

    # ----- weight sync ---------------------------------------------------------------------
    def update_weights(self, engine_urls: list[str], weight_version: str | None = None) -> dict[str, float]:
        """Push this trainer's weights into the engines at `engine_urls`; collective over all ranks.

        The sender (`update_weight.build_weight_sender`: --colocate -> shared-memory tensors, else
        a broadcast group) is built on the first call and rebuilt when the URLs change. With
        --check-weight-update-equal the engines' log-probs on a probe prompt are compared with
        ours (raises on mismatch). Returns metrics (empty unless the check ran)."""
        from slime.backends.megatron_utils import update_weight
        from slime.backends.megatron_utils.update_weight.check import check_engines_match_trainer

        sender = getattr(self, "_weight_sender", None)  # created lazily: most ranks' first use is here
        if sender is None or sender.engine_urls != [u.rstrip("/") for u in engine_urls]:
            if sender is not None:
                sender.disconnect()
            sender = self._weight_sender = update_weight.build_weight_sender(self.args, self.model, engine_urls)
        sender.update_weights(weight_version)
        if not self.args.check_weight_update_equal:
            return {}
        return check_engines_match_trainer(self, sender.engine_urls)
