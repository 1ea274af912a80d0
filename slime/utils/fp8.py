"""Block FP8 (e4m3) weights as FP8 Hugging Face checkpoints store them; torch only.

Owns the convention of DeepSeek-V3 / Qwen3-FP8 checkpoints (`quantization_config.quant_method ==
"fp8"` with `weight_block_size` [bn, bk]), read from SGLang 0.5.23 (`layers/quantization/fp8.py`
allocates `weight_scale_inv` as float32 [ceil(N/bn), ceil(K/bk)], `fp8_utils.block_quant_dequant`
multiplies): a linear weight `x.weight` [N, K] is stored as

    x.weight            float8_e4m3fn [N, K]      q = w / s (per block, rounded to nearest e4m3)
    x.weight_scale_inv  float32 [ceil(N/bn), ceil(K/bk)]   s = amax(|w| over the block) / 448

and dequantised as q * s (blocks at the right/bottom edge are partial). An all-zero block gets
s = 1 (q = 0), so no scale is ever zero.

Which weights are FP8 (`Fp8Config.is_fp8`): a `.weight` whose module's last name contains "proj"
(attention q/k/v/o_proj, MLP and expert gate/up/down_proj, fused qkv_proj / gate_up_proj, MLA's
q_a_proj / kv_b_proj / kv_a_proj_with_mqa, ...) and is not listed in `ignored_layers` /
`modules_to_not_convert` (matched on dotted module paths, with and without the leading "model.",
as SGLang does). Everything else (norms, the MoE router `mlp.gate`, embeddings, lm_head) keeps the
checkpoint's float dtype.

Error bound: e4m3 has 3 mantissa bits, so round-to-nearest moves a normal value by at most 2^-4
of itself; values below e4m3's smallest normal (2^-6, i.e. |w| < 2^-6 * s) by at most half the
subnormal step, 2^-10 * s = 2^-10 * amax / 448. Per element |dq(q(w)) - w| <= 2^-4 |w| + 2^-10 s.

UE8M0 scales (`Fp8Config.ue8m0`): SGLang with DeepGEMM on Blackwell (sm100 / sm120, SGLang's
`deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0`) requantises every loaded block scale to a power of two
(`should_deepgemm_weight_requant_ue8m0`, in both 0.5.23 and 0.5.15.post1), and checkpoints made
for it declare `quantization_config.scale_fmt: "ue8m0"`. There the scale is rounded up to the next
power of two before quantising (s = 2^ceil(log2(amax / 448)), so |w| / s still fits e4m3): the
engine's requantisation is then exact and the engine serves what the trainer quantised.
`engine_wants_ue8m0` says whether this device is such a GPU.

gloo cannot broadcast float8 tensors ("Invalid scalar type", seen with torch 2.13): `wire_view`
gives the same bytes as uint8 for gloo groups. Request metadata keeps the real dtype
(`float8_e4m3fn`), which is what SGLang allocates its receive buffers with.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SCALE_SUFFIX = "_scale_inv"  # "x.weight" -> "x.weight_scale_inv"


@dataclasses.dataclass(frozen=True)
class Fp8Config:
    """Block FP8 settings of an HF checkpoint: `block_size` (bn, bk) and the ignored module paths."""

    block_size: tuple[int, int]
    ignored: tuple[str, ...] = ()
    ue8m0: bool = False  # scales rounded up to powers of two (see the module docstring)

    def is_fp8(self, name: str) -> bool:
        """True when HF weight `name` is stored as float8 (+ `name`_scale_inv) in such a checkpoint."""
        if not name.endswith(".weight"):
            return False
        module = name[: -len(".weight")]
        if "proj" not in module.rsplit(".", 1)[-1]:
            return False
        return not any(_module_path_match(ignored, module) for ignored in self.ignored)


def _module_path_match(ignored: str, module: str) -> bool:
    """`ignored` names `module` or one of its parents, on dotted boundaries ("mlp.gate" is not
    "mlp.gate_proj"), as SGLang's quantization `_module_path_match` does."""
    ignored, module = ignored.rstrip("."), module.rstrip(".")
    return module == ignored or module.startswith(ignored + ".") or f".{ignored}." in f".{module}."


def fp8_config_from_hf(hf_config: dict) -> Fp8Config | None:
    """The `Fp8Config` of an HF config.json dict, or None when it declares no block FP8.

    Raises ValueError for an FP8 config this module cannot reproduce (no `weight_block_size`:
    per-tensor FP8; or a block size that is not two positive integers)."""
    quant = hf_config.get("quantization_config") or {}
    if quant.get("quant_method") != "fp8":
        return None
    block = quant.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ValueError(f"quantization_config: fp8 needs weight_block_size [bn, bk] (block FP8), got {block!r}")
    if quant.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"quantization_config: fp8 fmt {quant.get('fmt')!r} is not supported (e4m3 only)")
    ignored = list(quant.get("ignored_layers") or []) + list(quant.get("modules_to_not_convert") or [])
    names = [v for item in ignored for v in (item.removeprefix("model."), "model." + item.removeprefix("model."))]
    return Fp8Config(block_size=(block[0], block[1]), ignored=tuple(names), ue8m0=quant.get("scale_fmt") == "ue8m0")


def engine_wants_ue8m0(config: Fp8Config, env: dict | None = None) -> bool:
    """True when an SGLang engine on this kind of GPU requantises `config`'s scales to UE8M0: a
    Blackwell device (compute capability 10.x or 12.x), DeepGEMM not switched off
    (SGLANG_ENABLE_JIT_DEEPGEMM), 128x128 blocks (the only ones DeepGEMM takes)."""
    import os

    env = os.environ if env is None else env
    if not torch.cuda.is_available() or tuple(config.block_size) != (128, 128):
        return False
    if str(env.get("SGLANG_ENABLE_JIT_DEEPGEMM", "true")).lower() in ("0", "false", "no", "off"):
        return False
    return torch.cuda.get_device_capability()[0] in (10, 12)


def scale_shape(shape, block_size) -> tuple[int, int]:
    """Shape of the `weight_scale_inv` of a [N, K] weight: (ceil(N/bn), ceil(K/bk))."""
    return math.ceil(shape[0] / block_size[0]), math.ceil(shape[1] / block_size[1])


def quantize_block(weight: torch.Tensor, block_size, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float weight -> (float8_e4m3fn [N, K], float32 scale_inv [ceil(N/bn), ceil(K/bk)]).

    With `ue8m0` every scale is rounded up to a power of two. Runs on the weight's device; the
    math is in float32."""
    if weight.dim() != 2:
        raise ValueError(f"block FP8 quantises 2-D weights, got shape {tuple(weight.shape)}")
    (n, k), (bn, bk) = weight.shape, block_size
    rows, cols = scale_shape(weight.shape, block_size)
    padded = weight.new_zeros((rows * bn, cols * bk), dtype=torch.float32)
    padded[:n, :k] = weight.float()
    blocks = padded.view(rows, bn, cols, bk)
    amax = blocks.abs().amax(dim=(1, 3))
    # a tensor divisor: CUDA divides by a Python scalar as a multiply by its reciprocal, which
    # is not the CPU's correctly rounded quotient (a scale 1 ulp off, seen on an H100)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(rows * bn, cols * bk)[:n, :k].contiguous(), scale


def dequantize_block(q: torch.Tensor, scale_inv: torch.Tensor, block_size,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float8 [N, K] and its scale_inv -> `dtype` [N, K] (q * scale_inv per block)."""
    (n, k), (bn, bk) = q.shape, block_size
    if tuple(scale_inv.shape) != scale_shape(q.shape, block_size):
        raise ValueError(f"weight_scale_inv shape {tuple(scale_inv.shape)} != {scale_shape(q.shape, block_size)} "
                         f"for a {n}x{k} weight in {bn}x{bk} blocks")
    full = scale_inv.float().repeat_interleave(bn, dim=0).repeat_interleave(bk, dim=1)[:n, :k]
    return (q.float() * full).to(dtype)


def quantize_named(named: Iterable[tuple[str, torch.Tensor]], config: Fp8Config) -> list:
    """(name, tensor) pairs as an FP8 checkpoint stores them: every FP8 weight becomes
    (name, float8) followed by (name + "_scale_inv", float32); other tensors pass unchanged."""
    out = []
    for name, tensor in named:
        if config.is_fp8(name) and tensor.dim() == 2:
            q, scale = quantize_block(tensor, config.block_size, config.ue8m0)
            out += [(name, q), (name + SCALE_SUFFIX, scale)]
        else:
            out.append((name, tensor))
    return out


def quantized_buckets(buckets: Callable[[], Iterable[list]], config: Fp8Config) -> Callable[[], Iterable[list]]:
    """Wrap a bucket factory (as the weight senders take) so every bucket leaves quantised; a
    weight and its scale_inv always travel in the same bucket."""
    def wrapped():
        for bucket in buckets():
            yield quantize_named(bucket, config)

    return wrapped


def wire_view(tensor: torch.Tensor, device: str) -> torch.Tensor:
    """The tensor to hand a broadcast on a group of `device` ("cpu" = gloo): float8 as uint8
    bytes on gloo, which has no float8 type; unchanged otherwise. Shares `tensor`'s storage."""
    if device == "cpu" and tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return tensor.view(torch.uint8)
    return tensor
