"""Named patches that let megatron-core run without Transformer Engine or Apex, on any machine.

megatron-core 0.16.1 has torch fallbacks for TE's and Apex's kernels, but four places break when
those packages are absent: on a CPU machine, and as much on a GPU one that runs the local
(`--transformer-impl local`) spec without them; one more is slow (``patch_unfused_thd_rope``).
So these are applied wherever the model is built, CUDA or not
(``slime.backends.megatron_utils.parallel.initialize_megatron``; the CPU patches of
``cpu_compat`` come on top without CUDA). Each patch checks the package's absence itself (a no-op
where TE / Apex is installed), is idempotent and reports whether it changed anything.
Found on an H100 without TE (2026-11-26): the MoE router's forward raised ``NameError:
te_general_gemm`` in the first train step, because this patch was applied on CPU only.
"""

import importlib.util
import logging

import torch

logger = logging.getLogger(__name__)

_MARK = "_slime_te_absent"


def patch_mla_have_te() -> bool:
    """``megatron.core.transformer.multi_latent_attention.HAVE_TE`` -> False when Transformer Engine
    is absent.

    Why: megatron-core 0.16.1's MLA module imports ``TELinear`` from
    ``megatron.core.extensions.transformer_engine``, which without TE succeeds and hands back a
    placeholder object, so MLA sets ``HAVE_TE = True`` and its constructor's
    ``isinstance(self.linear_proj, TELinear)`` raises "isinstance() arg 2 must be a type" with
    the local spec (DeepSeek-V3 / Kimi-K2 / Moonlight on CPU). Can go when MLA reads
    ``extensions.transformer_engine.HAVE_TE`` (not the case up to 0.16.x).
    """
    from megatron.core.extensions import transformer_engine as te_ext
    from megatron.core.transformer import multi_latent_attention as mla

    if te_ext.HAVE_TE or not mla.HAVE_TE:
        return False
    mla.HAVE_TE = False
    return True


def patch_torch_adam_state_copy() -> bool:
    """``DistributedOptimizer._set_main_param_and_optimizer_states`` gives torch Adam's ``step``
    the value of the loaded param groups, never the parameter-state file's (no Apex/TE).

    Why: without Apex/TE, megatron-core 0.16.1's ``DistributedOptimizer`` keeps the authoritative
    ``step`` in the param groups (``state_dict`` reads it from the per-parameter states,
    ``load_state_dict`` writes it back into every state before the parameter states load). The
    parameter states then overwrite it: the ``dp_reshardable`` layout (ours) hands back the step
    of the fresh optimizer the load template was built from (1 after the zero-gradient step that
    materialises the state: seen a checkpoint saved at step 2 resume at step 1, so Adam's bias
    correction and every later step differed), and the ``fully_reshardable``,
    ``dp_zero_gather_scatter`` and ``fully_sharded_model_space`` loaders leave it out, which
    raises ``KeyError: 'step'``. So the state's own step (the param groups') is copied onto
    itself. TE/Apex FusedAdam keeps no per-parameter step. Can go when megatron restores the
    per-parameter step from the param groups (not the case up to 0.16.x).
    """
    from megatron.core.optimizer import distrib_optimizer as dopt

    original = dopt.DistributedOptimizer._set_main_param_and_optimizer_states
    if dopt.HAVE_APEX_OR_TE or getattr(original, _MARK, False):
        return False

    def set_states(self, model_param, tensors):
        if not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            step = self.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step}  # copied onto itself: the param groups' step stays
        return original(self, model_param, tensors)

    setattr(set_states, _MARK, True)
    dopt.DistributedOptimizer._set_main_param_and_optimizer_states = set_states
    return True


def patch_te_general_gemm() -> bool:
    """Define ``moe_utils.te_general_gemm = None`` when Transformer Engine is absent.

    Why: megatron-core 0.16.1 imports ``te_general_gemm`` inside a ``try`` in
    ``transformer/moe/moe_utils.py`` and leaves the name undefined on ImportError, but
    ``router_gating_linear`` tests ``te_general_gemm is not None`` -> NameError in the
    MoE router's forward. ``None`` makes it take its torch fallback. Can go when
    upstream binds the name in the ``except`` branch.
    """
    from megatron.core.transformer.moe import moe_utils

    if hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
    return True


def _absent_te_is_older(_version, check_equality: bool = True) -> bool:
    """Stand-in of megatron's ``is_te_min_version`` when Transformer Engine is absent: no
    version is reached."""
    return False


def patch_optimizer_te_version() -> bool:
    """``megatron.core.optimizer.optimizer_config.is_te_min_version`` -> False without TE.

    Why: megatron-core 0.16.1's ``OptimizerConfig.__post_init__`` asks TE's version for every
    ``--use-precision-aware-optimizer`` config (to turn ``store_param_remainders`` off below TE
    2.1, a FusedAdam option) before it returns for ``--optimizer-cpu-offload``, whose
    HybridDeviceOptimizer never uses TE; without TE the comparison raises ``TypeError`` (None >=
    Version). The stand-in lets the MoE recipes' CPU Adam config build wherever TE is absent. Can go when megatron checks the version only where FusedAdam is used.
    """
    from megatron.core.optimizer import optimizer_config

    if importlib.util.find_spec("transformer_engine") is not None:
        return False
    if optimizer_config.is_te_min_version is _absent_te_is_older:
        return False
    optimizer_config.is_te_min_version = _absent_te_is_older
    return True


def _thd_rope_in_one_pass(original):
    """``rope_utils._apply_rotary_pos_emb_thd`` with each token's frequencies gathered by its
    position in its own sequence (one index over the packed row) instead of sliced sequence by
    sequence in Python, then rotated by upstream's ``_apply_rotary_pos_emb_bshd`` (looked up
    here, not per call); `original` keeps the cases it does not cover."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd as rotate_bshd

    def apply(t, cu_seqlens, freqs, rotary_interleaved=False, multi_latent_attention=False,
              mscale=1.0, cp_group=None):
        kwargs = dict(rotary_interleaved=rotary_interleaved, multi_latent_attention=multi_latent_attention,
                      mscale=mscale, cp_group=cp_group)
        total = t.size(0)
        # context parallel (load-balanced halves), freqs over every packed position (offset
        # mapping) and a row the sequence lengths do not cover stay with upstream's loop
        if (cp_group is None or cp_group.size() != 1 or freqs.size(0) == total
                or cu_seqlens.numel() < 2 or int(cu_seqlens[-1]) != total):
            return original(t, cu_seqlens, freqs, **kwargs)
        starts = cu_seqlens[:-1].to(torch.long)
        lengths = cu_seqlens[1:].to(torch.long) - starts
        positions = (torch.arange(total, device=t.device)
                     - torch.repeat_interleave(starts, lengths, output_size=total))
        return rotate_bshd(
            t.unsqueeze(1), freqs.index_select(0, positions.to(freqs.device)),
            rotary_interleaved=rotary_interleaved, multi_latent_attention=multi_latent_attention,
            mscale=mscale,
        ).squeeze(1)

    setattr(apply, _MARK, True)
    return apply


def patch_unfused_thd_rope() -> bool:
    """``rope_utils._apply_rotary_pos_emb_thd`` (unfused RoPE on a packed THD row) -> one gather
    of the frequencies by in-sequence position, then upstream's own ``_apply_rotary_pos_emb_bshd``.

    Why: without Transformer Engine ``apply_rope_fusion`` is off and megatron-core 0.16.1 applies
    RoPE to packed sequences by splitting the row into its sequences in Python (a host sync for
    the lengths, one slice of the frequencies per sequence, a concatenation), for the queries and
    the keys of every layer: 1024 slices per forward for 256 one-token samples on 2 layers. The
    same frequencies land on the same tokens (an index gather instead of slices), and upstream's
    elementwise rotation runs unchanged, so the result is bitwise the same
    (``tests/unit/backends/megatron_utils/test_thd_rope.py``). Context parallelism and the
    offset-mapped frequencies of VLM RoPE keep upstream's loop. Not applied where TE is
    installed: its fused THD kernel is used instead. Can go when upstream vectorises the loop.
    """
    from megatron.core.models.common.embeddings import rope_utils

    original = rope_utils._apply_rotary_pos_emb_thd
    if importlib.util.find_spec("transformer_engine") is not None or getattr(original, _MARK, False):
        return False
    rope_utils._apply_rotary_pos_emb_thd = _thd_rope_in_one_pass(original)
    return True


TE_ABSENT_PATCHES = {
    "mla_have_te": patch_mla_have_te,
    "te_general_gemm": patch_te_general_gemm,
    "torch_adam_state_copy": patch_torch_adam_state_copy,
    "optimizer_te_version": patch_optimizer_te_version,
    "unfused_thd_rope": patch_unfused_thd_rope,
}


def apply_te_absent_patches() -> dict:
    """Apply every patch in ``TE_ABSENT_PATCHES`` (each a no-op where its package is installed);
    returns ``{name: changed}``. Safe to call again."""
    changed = {name: patch() for name, patch in TE_ABSENT_PATCHES.items()}
    logger.info("megatron patches for absent Transformer Engine / Apex: %s", changed)
    return changed
