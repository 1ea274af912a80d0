"""HF <-> Megatron ``torch_dist`` checkpoint conversion (the two tools' library half).

Owns the converters' argument parsing (Megatron-LM MODEL_ARGS via the shared
megatron argument domain), the MODEL_ARGS vs HF ``config.json`` check, and the two
conversions; the ``torch_dist`` layout itself (writing, reading, the tracker file) is
``torch_dist.py``'s.
"""

import argparse
import logging
import os
from pathlib import Path
from typing import Optional

from slime.backends.megatron_utils.torch_dist import load_torch_dist, save_model

logger = logging.getLogger(__name__)


def _megatron_parser(description: str) -> argparse.ArgumentParser:
    from slime.utils.arguments import megatron as megatron_domain

    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    megatron_domain.add_arguments(parser)
    return parser


def _validate_megatron(args: argparse.Namespace, world_size: int) -> argparse.Namespace:
    """Resolve Megatron-LM derived defaults and check the layout against ``world_size``."""
    from slime.utils.arguments import megatron as megatron_domain

    args.actor_num_nodes, args.actor_num_gpus_per_node = 1, world_size
    for warning in megatron_domain.validate(args):
        logger.warning("%s", warning)
    return args


def parse_hf_to_torch_dist_args(argv=None) -> argparse.Namespace:
    """``${MODEL_ARGS[@]} --hf-checkpoint DIR --save DIR`` (world size from ``WORLD_SIZE``)."""
    parser = _megatron_parser("Convert a Hugging Face checkpoint to a Megatron torch_dist checkpoint.")
    parser.add_argument("--hf-checkpoint", required=True, help="Hugging Face model folder to read.")
    parser.add_argument("--save", required=True, help="Megatron checkpoint folder to write.")
    args = parser.parse_args(argv)
    return _validate_megatron(args, int(os.environ.get("WORLD_SIZE", 1)))


def parse_torch_dist_to_hf_args(argv=None) -> argparse.Namespace:
    """``--input-dir DIR/iter_XXXXXXX --output-dir DIR --origin-hf-dir DIR [MODEL_ARGS...]``."""
    parser = _megatron_parser("Convert a Megatron torch_dist checkpoint to Hugging Face safetensors.")
    parser.add_argument("--input-dir", required=True, help="Checkpoint iteration folder (iter_XXXXXXX).")
    parser.add_argument("--output-dir", required=True, help="Hugging Face folder to write.")
    parser.add_argument("--origin-hf-dir", required=True,
                        help="Original HF folder: config, tokenizer and generation config are copied.")
    args = parser.parse_args(argv)
    if args.num_layers is None:
        return args  # no MODEL_ARGS: the shape comes from --origin-hf-dir
    return _validate_megatron(args, 1)


def check_model_args(args: argparse.Namespace, hf_config: dict, hf_dir) -> None:
    """Raise ValueError listing every MODEL_ARGS / HF config mismatch (both values named)."""
    from slime.models import check_hf_config

    problems = check_hf_config(args, hf_config)
    if problems:
        raise ValueError(
            f"MODEL_ARGS do not match {Path(hf_dir) / 'config.json'}:\n  " + "\n  ".join(problems)
        )


def convert_hf_to_torch_dist(args: argparse.Namespace) -> Path:
    """Build this rank's GPTModel, fill it from ``--hf-checkpoint``, save to ``--save``.

    Process group: env:// (torchrun) or a single local rank. Raises on a MODEL_ARGS /
    config.json mismatch before any distributed work.
    """
    from slime.backends.megatron_utils.hf_io import HFCheckpoint
    from slime.backends.megatron_utils.hf_loader import load_hf_weights, shard_context_for
    from slime.backends.megatron_utils.model_provider import build_model_for_stage
    from slime.backends.megatron_utils.parallel import initialize_megatron
    from slime.models import weight_map_for

    hf = HFCheckpoint(args.hf_checkpoint)
    check_model_args(args, hf.config, args.hf_checkpoint)
    initialize_megatron(args)
    model = build_model_for_stage(args)
    wmap = weight_map_for(
        hf.config, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size
    )
    load_hf_weights(model, hf, wmap, shard_context_for(model, wmap.num_experts))
    return save_model(model, args, args.save, iteration=0)


def _export_args(args: Optional[argparse.Namespace], hf_config: dict, saved_args) -> argparse.Namespace:
    """Single-rank model args for export: MODEL_ARGS or the HF config, saved vocab padding."""
    from megatron.core.extensions import transformer_engine as te_ext

    from slime.backends.megatron_utils.hf_loader import args_from_hf_config

    if args is None or args.num_layers is None:
        args = args_from_hf_config(hf_config)
    else:
        check_model_args(args, hf_config, "--origin-hf-dir")
    saved_tp = getattr(saved_args, "tensor_model_parallel_size", 1) or 1
    saved_div = getattr(saved_args, "make_vocab_size_divisible_by", 128) or 128
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                 "expert_model_parallel_size", "expert_tensor_parallel_size", "context_parallel_size"):
        setattr(args, name, 1)
    args.sequence_parallel = False
    args.make_vocab_size_divisible_by = saved_div * saved_tp  # same padded vocab as saved
    if not te_ext.HAVE_TE:
        args.transformer_impl = "local"  # export only reads weights; local modules suffice
    # Build in the saved dtype so the checkpoint loads without casts; export casts to HF's.
    args.bf16 = bool(getattr(saved_args, "bf16", False))
    args.fp16 = bool(getattr(saved_args, "fp16", False))
    return args


def convert_torch_dist_to_hf(input_dir, output_dir, origin_hf_dir, args=None) -> Path:
    """Load ``input_dir`` (iter folder) on one rank and write HF safetensors to ``output_dir``.

    The model shape comes from MODEL_ARGS when given, else from ``origin_hf_dir``'s config;
    config / tokenizer / generation config files are copied from ``origin_hf_dir``.
    """
    from megatron.core import dist_checkpointing

    from slime.backends.megatron_utils.hf_io import read_hf_config
    from slime.backends.megatron_utils.model_provider import build_model_for_stage
    from slime.backends.megatron_utils.parallel import initialize_megatron
    from slime.backends.megatron_utils.weight_export import write_hf_checkpoint

    hf_config = read_hf_config(origin_hf_dir)
    saved = dist_checkpointing.load_common_state_dict(str(input_dir)).get("args")
    args = _export_args(args, hf_config, saved)
    initialize_megatron(args, rank=0, world_size=1)
    model = build_model_for_stage(args)
    load_torch_dist(model, input_dir)
    sizes = {"make_vocab_size_divisible_by": args.make_vocab_size_divisible_by, "tensor_model_parallel_size": 1}
    return write_hf_checkpoint(model, sizes, origin_hf_dir, output_dir)
