"""megatron-core's config objects built before any process group: the dry run's and start-up's check.

`check_megatron_configs` constructs ``TransformerConfig`` (``MLATransformerConfig`` with
``--multi-latent-attention``), ``OptimizerConfig`` and ``DistributedDataParallelConfig`` with the
functions the trainer ranks use (`slime.backends.megatron_utils.config`), so megatron-core's own
``__post_init__`` checks run for real on any machine, before Ray or a process group starts. The
dry run builds them as the GPU run would (`Kernels.gpu_run`: CUDA, Transformer Engine, fusions
on, the recipe's dtypes and optimizer flags; a ``--distributed-backend gloo`` recipe: the CPU run);
start-up builds them for the machine it runs on when that has CUDA, else as the dry run does.

A refusal from megatron-core becomes one `ConfigRefused` line that names our flags: every
identifier in megatron's message that is a config field is mapped back to the flag that sets it
(the config builders' field <- dest tables, then the parser's dest -> option string).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import re

from slime.backends.megatron_utils import config as cfg
from slime.backends.megatron_utils.kernels import Kernels

# The Transformer Engine version megatron-core's checks are answered with when the dry run builds
# the GPU run's configs on a machine without TE (docs/gpu-guide.md installs a current 2.x release).
GPU_TE_VERSION = "2.8.0"


class ConfigRefused(ValueError):
    """megatron-core refused a config built from the flags; the message names the flags."""


def _flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> its first long option string."""
    out = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs:
            out.setdefault(action.dest, longs[0])
    return out


def flags_named_in(message: str, parser: argparse.ArgumentParser) -> list[str]:
    """Our flags a megatron-core message is about, in order of appearance: ``--flags`` it names
    that we have, and config field names (``num_attention_heads``) mapped back to their flag."""
    flags_of = _flags_of(parser)
    known = set(flags_of.values())
    field_dest = cfg.config_field_dests()
    found = []
    for token in re.findall(r"--[a-z0-9][a-z0-9-]*|[A-Za-z_][A-Za-z0-9_]*", message):
        if token.startswith("--"):
            flag = token if token in known else None
        else:
            dest = field_dest.get(token, token)
            flag = flags_of.get(dest) if ("_" in token or token in field_dest) else None
        if flag and flag not in found:
            found.append(flag)
    return found


_MISSING = object()


def _placeholder_kernel(*_args, **_kwargs):
    raise RuntimeError("Transformer Engine stand-in: configs only, no kernel runs in a dry run")


_TE_KERNELS = {
    "megatron.core.models.common.embeddings.rope_utils": (
        "fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"),
    "megatron.core.transformer.moe.moe_utils": (
        "fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
        "fused_sort_chunks_by_index_with_probs", "fused_unpermute"),
}


@contextlib.contextmanager
def transformer_engine_as_on_gpu(version: str = GPU_TE_VERSION):
    """Answer megatron-core's Transformer Engine probes as the GPU machine would, for config
    construction only, on a machine without TE: ``megatron.core.utils``'s cached TE version is
    ``version`` and the fused rope / permute kernel names its config checks look up are present
    (placeholders that raise if called). Why: ``TransformerConfig.__post_init__`` refuses
    ``apply_rope_fusion`` / ``moe_permute_fusion`` when those names are None, and
    ``OptimizerConfig.__post_init__`` compares the TE version with the precision-aware optimizer,
    so without TE every GPU recipe would be refused for this machine's sake, not for its flags.
    Everything is restored on exit. megatron-core 0.16.1; needed while its checks probe TE."""
    import importlib

    from packaging.version import Version

    import megatron.core.utils as mcore_utils

    saved = []
    targets = [(mcore_utils, "_te_version", Version(version))]
    for module_name, names in _TE_KERNELS.items():
        module = importlib.import_module(module_name)
        targets += [(module, name, _placeholder_kernel) for name in names]
    try:
        for module, name, value in targets:
            saved.append((module, name, getattr(module, name, _MISSING)))
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            if value is _MISSING:
                delattr(module, name)
            else:
                setattr(module, name, value)



def _build(args: argparse.Namespace, kernels: Kernels, role: str) -> list[tuple[str, str]]:
    transformer = cfg.transformer_config_from_args(args, kernels)
    optimizer = cfg.optimizer_config_from_args(args, kernels)
    ddp = cfg.ddp_config_from_args(args)
    fusions = [name for name in cfg.FUSION_FLAGS if getattr(transformer, name)]
    return [
        (f"{role} {type(transformer).__name__}",
         f"{transformer.params_dtype}, fusions: {', '.join(fusions) or 'none'}"),
        (f"{role} OptimizerConfig", f"{optimizer.optimizer}, distributed optimizer "
         f"{optimizer.use_distributed_optimizer}, CPU offload {optimizer.optimizer_cpu_offload}, "
         f"precision-aware {optimizer.use_precision_aware_optimizer}"),
        (f"{role} DDP config", f"DistributedDataParallelConfig, grads reduced in fp32 "
         f"{ddp.grad_reduce_in_fp32}, distributed optimizer {ddp.use_distributed_optimizer}"),
    ]


def _notes(rows: list[tuple[str, str]], kernels: Kernels, stand_in: bool) -> list[tuple[str, str]]:
    notes = []
    if stand_in:
        notes.append(("Transformer Engine", f"not installed here: megatron-core's checks answered as TE "
                                            f"{GPU_TE_VERSION} on the GPU machine"))
    if kernels.cuda and any("gradient_accumulation_fusion" in summary for _, summary in rows):
        notes.append(("gradient_accumulation_fusion", "needs apex's fused_weight_gradient_mlp_cuda on the GPU "
                      "machine (docs/gpu-guide.md); without it the run turns the fusion off with a warning"))
    return notes


def check_megatron_configs(args: argparse.Namespace, kernels: Kernels | None = None) -> list[tuple[str, str]]:
    """Build the trainer's megatron-core configs (the critic's too with ``--advantage-estimator
    ppo``) for ``kernels``. Default: at start-up on a CUDA machine, this machine (the job's driver
    runs on a node of the kind its trainer ranks run on); with ``--dry-run``, or a driver without
    CUDA, the machine the recipe is written for (`Kernels.of_recipe`: a GPU recipe gets
    `Kernels.gpu_run`, TE and fusions on). Returns (config, summary) rows for the plan, then notes
    on what the GPU run's values depend on.

    Raises `ConfigRefused` with one line naming the flags when megatron-core refuses a value."""
    from slime.utils.arguments import build_parser
    from slime.utils.arguments.critic import critic_view, uses_critic

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise ConfigRefused("megatron-core is not installed: the trainer (and the dry run, which builds its "
                            "config objects) needs it; pip install -e '.[megatron]'")
    if kernels is None:
        here = Kernels.here()
        kernels = here if here.cuda and not getattr(args, "dry_run", False) else Kernels.of_recipe(args)
    stand_in = kernels.transformer_engine and importlib.util.find_spec("transformer_engine") is None
    views = [("actor", args)] + ([("critic", critic_view(args))] if uses_critic(args) else [])
    try:
        with transformer_engine_as_on_gpu() if stand_in else contextlib.nullcontext():
            rows = [row for role, view in views for row in _build(view, kernels, role)]
    except (AssertionError, ValueError, TypeError, RuntimeError, ImportError) as e:
        message = " ".join(str(e).split()) or type(e).__name__
        flags = flags_named_in(message, build_parser(getattr(args, "entry", "train")))
        raise ConfigRefused(f"{', '.join(flags) or 'megatron-core config'}: megatron-core refuses "
                            f"these values ({type(e).__name__}): {message}") from e
    return rows + _notes(rows, kernels, stand_in)
