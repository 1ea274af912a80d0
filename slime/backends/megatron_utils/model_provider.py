"""megatron-core ``GPTModel`` for Qwen3 dense and MoE, built from args.

Owns the model provider: the padded vocabulary, the block spec for
``--transformer-impl`` (see ``layer_specs``) or the user's ``--spec``, rotary settings, tied / untied output
layer and pre/post-process flags per pipeline stage. The returned callable has
slime's ``--custom-model-provider-path`` signature
``(pre_process, post_process, vp_stage=None) -> GPTModel``.
"""

import argparse
import logging
from typing import Callable, Optional

from slime.backends.megatron_utils.config import transformer_config_from_args
from slime.backends.megatron_utils.layer_specs import block_spec_for, load_layer_spec
from slime.models.weight_map import padded_vocab_size

logger = logging.getLogger(__name__)


def padded_vocab_size_from_args(args: argparse.Namespace) -> int:
    """Padded vocabulary for ``--vocab-size`` / ``--make-vocab-size-divisible-by`` / TP."""
    if getattr(args, "vocab_size", None) is None:
        raise ValueError("--vocab-size is required to build the model")
    return padded_vocab_size(
        args.vocab_size,
        getattr(args, "make_vocab_size_divisible_by", 128) or 128,
        getattr(args, "tensor_model_parallel_size", 1) or 1,
    )


def build_gpt_model(
    args: argparse.Namespace,
    pre_process: bool,
    post_process: bool,
    vp_stage: Optional[int] = None,
    config=None,
):
    """Build one GPTModel chunk (this rank's PP stage) on the current device.

    ``config`` defaults to ``transformer_config_from_args(args)``.
    """
    from megatron.core.models.gpt import GPTModel

    config = config or transformer_config_from_args(args)
    if getattr(args, "enable_experimental", False):
        from megatron.core.config import set_experimental_flag

        set_experimental_flag(True)
    if getattr(args, "spec", None):
        block_spec = load_layer_spec(args.spec, args, config, vp_stage)
    else:
        impl = getattr(args, "transformer_impl", "local") or "local"
        block_spec = block_spec_for(impl, config, vp_stage=vp_stage)
    max_len = getattr(args, "max_position_embeddings", None) or getattr(args, "seq_length", None)
    return GPTModel(
        config=config,
        transformer_layer_spec=block_spec,
        vocab_size=padded_vocab_size_from_args(args),
        max_sequence_length=max_len or 4096,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not getattr(
            args, "untie_embeddings_and_output_weights", False
        ),
        position_embedding_type=getattr(args, "position_embedding_type", "rope") or "rope",
        rotary_percent=getattr(args, "rotary_percent", 1.0) or 1.0,
        rotary_base=int(getattr(args, "rotary_base", 10000) or 10000),
        vp_stage=vp_stage,
    )


def get_model_provider(args: argparse.Namespace) -> Callable:
    """Model provider ``(pre_process, post_process, vp_stage=None) -> GPTModel`` for args."""

    def provider(pre_process: bool = True, post_process: bool = True, vp_stage=None):
        return build_gpt_model(args, pre_process, post_process, vp_stage=vp_stage)

    return provider


def build_model_for_stage(args: argparse.Namespace, config=None):
    """Build this rank's GPTModel with pre/post-process set from its PP stage; with
    ``--custom-model-provider-path`` that function builds it instead (slime's call site: called as
    ``fn(pre_process, post_process[, vp_stage=None])``, ``config`` unused)."""
    from megatron.core import parallel_state as mpu

    pre = mpu.is_pipeline_first_stage(ignore_virtual=True)
    post = mpu.is_pipeline_last_stage(ignore_virtual=True)
    if getattr(args, "custom_model_provider_path", None):
        from slime.utils.misc import load_function
        from slime.utils.plugins import call_model_provider

        logger.info("model built by --custom-model-provider-path %s", args.custom_model_provider_path)
        return call_model_provider(load_function(args.custom_model_provider_path), pre, post, vp_stage=None)
    return build_gpt_model(args, pre, post, config=config)
