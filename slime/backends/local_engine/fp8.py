"""FP8 block-quantised checkpoints in the local engine: load them, and take FP8 weight updates.

Owns `Fp8Weights` (which weights are FP8 in the served checkpoint and how to turn (weight,
scale_inv) pairs into the engine's compute dtype) and `load_causal_lm` (the model from an HF
folder, dequantising an FP8 checkpoint on load; transformers' own FP8 loader needs a GPU).

The engine computes in its --dtype: FP8 weights are dequantised (`slime.utils.fp8`:
q * scale_inv per block) into its parameters. Which names are FP8 is read from the checkpoint
itself: every `x.weight` stored with an `x.weight_scale_inv`. Update rules (every transport:
disk, distributed, tensor):
- an FP8 weight must arrive as float8_e4m3fn together with its float32 `weight_scale_inv` in
  the same request (our senders quantise per bucket, so a pair never straddles two requests;
  nothing is buffered across requests, so a half pair can never linger);
- a float (bf16/fp32) tensor for a weight that is FP8 in the checkpoint is refused (400): the
  sender did not quantise, and loading it would mean the engine and SGLang disagree;
- a float8 tensor or a scale_inv for a weight the checkpoint keeps in float is refused too.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import torch

from slime.backends.local_engine.sampling import RequestError
from slime.utils.fp8 import FP8_DTYPE, SCALE_SUFFIX, dequantize_block, fp8_config_from_hf, scale_shape

logger = logging.getLogger(__name__)


class Fp8Weights:
    """The FP8 side of a served checkpoint: `block_size` and the set of FP8 weight names."""

    def __init__(self, block_size, fp8_names) -> None:
        self.block_size = tuple(block_size)
        self.fp8_names = frozenset(fp8_names)

    @classmethod
    def from_checkpoint(cls, model_path) -> "Fp8Weights | None":
        """None unless `model_path`'s config.json declares block FP8 (quant_method "fp8")."""
        with open(os.path.join(str(model_path), "config.json")) as f:
            config = fp8_config_from_hf(json.load(f))
        if config is None:
            return None
        names = {n for path in _safetensors_files(model_path) for n in _tensor_names(path)}
        fp8 = {n[: -len(SCALE_SUFFIX)] for n in names if n.endswith(SCALE_SUFFIX)}
        return cls(config.block_size, fp8)

    def dequantize_named(self, named) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs of one update -> pairs for the model (FP8 weights dequantised to
        float32, scales consumed). Raises `RequestError` for any rule of the module docstring."""
        named = list(named)
        by_name = dict(named)
        out = []
        for name, tensor in named:
            if name.endswith(SCALE_SUFFIX):
                if name[: -len(SCALE_SUFFIX)] not in by_name:
                    raise RequestError(f"{name!r} arrived without its weight {name[: -len(SCALE_SUFFIX)]!r} "
                                       f"in the same update")
                continue
            out.append((name, self._to_compute(name, tensor, by_name.get(name + SCALE_SUFFIX))))
        return out

    def _to_compute(self, name: str, tensor: torch.Tensor, scale) -> torch.Tensor:
        if name not in self.fp8_names:
            if tensor.dtype == FP8_DTYPE or scale is not None:
                raise RequestError(f"weight {name!r} is not FP8 in the served checkpoint; send it in a float dtype "
                                   f"without a scale_inv (got {tensor.dtype})")
            return tensor
        if tensor.dtype != FP8_DTYPE:
            raise RequestError(
                f"weight {name!r} is FP8 (float8_e4m3fn + weight_scale_inv, {self.block_size} blocks) in the "
                f"served checkpoint, got {str(tensor.dtype).removeprefix('torch.')}: quantise it before sending "
                f"(the senders do when --hf-checkpoint's config.json has quantization_config.quant_method 'fp8')")
        if scale is None:
            raise RequestError(f"FP8 weight {name!r} arrived without {name + SCALE_SUFFIX!r} in the same update")
        if scale.dtype != torch.float32 or tuple(scale.shape) != scale_shape(tensor.shape, self.block_size):
            raise RequestError(f"{name + SCALE_SUFFIX!r}: expected float32 {scale_shape(tensor.shape, self.block_size)}"
                               f", got {str(scale.dtype).removeprefix('torch.')} {tuple(scale.shape)}")
        return dequantize_block(tensor, scale, self.block_size)

    def receive(self, group, names, dtypes: list[torch.dtype], shapes, device: str) -> list[tuple[str, torch.Tensor]]:
        """Receive one distributed update into fresh buffers of the announced dtypes (resolved by
        `weights.announced_dtypes`); names are checked afterwards (`dequantize_named`), once every
        broadcast was drained."""
        named = [(n, torch.empty(tuple(s), dtype=d, device=device)) for n, d, s in zip(names, dtypes, shapes)]
        for _, buffer in named:
            group.broadcast(buffer, src=0)
        return named


def _safetensors_files(model_path) -> list[str]:
    files = sorted(glob.glob(os.path.join(str(model_path), "*.safetensors")))
    if not files:
        raise ValueError(f"{model_path!r} has no *.safetensors files")
    return files


def _tensor_names(path: str) -> list[str]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return list(f.keys())


def load_causal_lm(model_path, dtype: torch.dtype, resolve) -> tuple[torch.nn.Module, "Fp8Weights | None"]:
    """(model, its `Fp8Weights` or None) from the HF folder `model_path`, weights in `dtype`.

    A non-FP8 checkpoint loads through transformers. An FP8 one is built from its config without
    the quantization_config, then every checkpoint tensor is dequantised and copied into the
    parameter `resolve(params, name)` names; a parameter left unloaded is an error."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    fp8 = Fp8Weights.from_checkpoint(model_path)
    if fp8 is None:
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype), None
    config = AutoConfig.from_pretrained(model_path)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))  # anything the checkpoint misses stays NaN and is caught below
        named = [item for path in _safetensors_files(model_path) for item in load_file(path).items()]
        for name, tensor in fp8.dequantize_named(named):  # shards may split a weight from its scale
            resolve(params, name).copy_(tensor)
    missing = [n for n, p in params.items() if torch.isnan(p).any()]
    if missing:
        raise ValueError(f"FP8 checkpoint {model_path}: no weights for {missing[:5]}")
    logger.info("loaded FP8 checkpoint %s: %d FP8 weights dequantised to %s (blocks %s)", model_path,
                len(fp8.fp8_names), dtype, fp8.block_size)
    return model, fp8
