"""Reading and writing Hugging Face safetensors checkpoints.

Owns ``HFCheckpoint`` (lazy, per-tensor reads from ``model.safetensors`` or a
sharded ``model.safetensors.index.json`` folder, plus its ``config.json``) and
``save_hf_checkpoint`` (writes safetensors shards with an index and copies
config / tokenizer / generation config files from the original HF folder).
"""

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Iterable

import torch

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Files copied verbatim from the original HF folder next to exported weights.
AUX_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
)


def read_hf_config(hf_dir) -> dict:
    """``config.json`` of an HF folder as a dict; raises naming the file when missing."""
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: --hf-checkpoint must be a Hugging Face folder")
    return json.loads(path.read_text())


class HFCheckpoint:
    """Lazy reader of an HF safetensors checkpoint folder (no tensor read until ``get``).

    A block-FP8 checkpoint (``quantization_config.quant_method == "fp8"``) reads back as float32:
    ``get`` dequantises each float8 weight with its ``weight_scale_inv`` (``slime.utils.fp8``)."""

    def __init__(self, hf_dir):
        from slime.utils.fp8 import fp8_config_from_hf

        self.dir = Path(hf_dir)
        self.config = read_hf_config(self.dir)
        self.fp8 = fp8_config_from_hf(self.config)
        self._file_of = self._build_index()
        self._handles = {}

    def _build_index(self) -> dict:
        from safetensors import safe_open

        index = self.dir / INDEX_FILE
        if index.is_file():
            return dict(json.loads(index.read_text())["weight_map"])
        single = self.dir / SINGLE_FILE
        if not single.is_file():
            raise FileNotFoundError(f"neither {index} nor {single} exists")
        with safe_open(str(single), framework="pt") as handle:
            return {name: SINGLE_FILE for name in handle.keys()}

    def keys(self) -> list:
        """All tensor names in the checkpoint."""
        return list(self._file_of)

    def get(self, name: str) -> torch.Tensor:
        """Tensor ``name`` (CPU); raises KeyError naming the folder when absent."""
        from safetensors import safe_open

        from slime.utils.fp8 import FP8_DTYPE, SCALE_SUFFIX, dequantize_block

        if name not in self._file_of:
            raise KeyError(f"tensor {name!r} not found in HF checkpoint {self.dir}")
        fname = self._file_of[name]
        if fname not in self._handles:
            self._handles[fname] = safe_open(str(self.dir / fname), framework="pt")
        tensor = self._handles[fname].get_tensor(name)
        if self.fp8 is not None and tensor.dtype == FP8_DTYPE:
            return dequantize_block(tensor, self.get(name + SCALE_SUFFIX), self.fp8.block_size)
        return tensor


def _shards(named: Iterable, max_shard_bytes: int) -> list:
    shards, current, size = [], {}, 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor.contiguous()
        size += nbytes
    if current:
        shards.append(current)
    return shards


def _drop_fp8_quantization_config(config_path: Path) -> None:
    """Unquantised weights under an FP8 origin's config.json (e.g. --save-hf with an FP8
    --hf-checkpoint): remove its fp8 quantization_config, or loaders would read them as FP8."""
    if not config_path.is_file():
        return
    config = json.loads(config_path.read_text())
    if (config.get("quantization_config") or {}).get("quant_method") == "fp8":
        del config["quantization_config"]
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        logger.info("%s: float weights, so the origin's fp8 quantization_config is dropped", config_path)


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _declare_exported_mtp_layers(config_path: Path, names: Iterable[str]) -> None:
    """Make config.json's ``num_nextn_predict_layers`` (the multi-token-prediction layers that follow
    the ``num_hidden_layers`` decoder layers in DeepSeek-V3 / GLM-4.5 checkpoints) count the MTP
    layers actually written: the trainer does not build them, and a config declaring layers that
    are absent makes SGLang's NextN / EAGLE draft model load nothing for them."""
    if not config_path.is_file():
        return
    config = json.loads(config_path.read_text())
    declared, layers = config.get("num_nextn_predict_layers"), config.get("num_hidden_layers")
    if not declared or layers is None:
        return
    written = len({int(m.group(1)) for m in map(_LAYER.match, names) if m and int(m.group(1)) >= layers})
    if written != declared:
        config["num_nextn_predict_layers"] = written
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        logger.info("%s: num_nextn_predict_layers %s -> %d (the MTP layers written)", config_path, declared, written)


def save_hf_checkpoint(
    named_tensors: Iterable,
    output_dir,
    origin_hf_dir=None,
    max_shard_bytes: int = 5 * 1024**3,
) -> Path:
    """Write ``(name, tensor)`` pairs as safetensors shards + index under ``output_dir``.

    Files in ``AUX_FILES`` present in ``origin_hf_dir`` are copied unchanged, except that an fp8
    ``quantization_config`` is dropped from config.json when no tensor written is float8, and its
    ``num_nextn_predict_layers`` counts the multi-token-prediction layers written (0 when, as from
    the trainer, none are).
    Returns the output folder.
    """
    from safetensors.torch import save_file

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = _shards(named_tensors, max_shard_bytes)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = SINGLE_FILE if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        for name, tensor in shard.items():
            weight_map[name] = fname
            total += tensor.numel() * tensor.element_size()
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
    if origin_hf_dir is not None:
        for aux in AUX_FILES:
            src = Path(origin_hf_dir) / aux
            if src.is_file():
                shutil.copyfile(src, out / aux)
        if not any(t.dtype == torch.float8_e4m3fn for shard in shards for t in shard.values()):
            _drop_fp8_quantization_config(out / "config.json")
        _declare_exported_mtp_layers(out / "config.json", weight_map)
    logger.info("wrote %d tensors in %d file(s) to %s", len(weight_map), len(shards), out)
    return out
