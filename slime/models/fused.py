"""Checkpoint tensors that SGLang fuses on load, so they must reach it in the same weight update.

Owns the registry `FUSED_GROUPS`: HF ``architectures[0]`` -> function(hf_config) -> the fused
groups of that config. A group is a tuple of name fragments; checkpoint names that differ only in
which fragment they contain are one fused set (e.g. ``model.layers.3.self_attn.q_a_proj.weight``
and ``model.layers.3.self_attn.kv_a_proj_with_mqa.weight``). Only groups whose members SGLang
*caches until every member arrived in the same* ``load_weights`` *call* are listed: SGLang drops a
member whose partner comes in another call, without an error, leaving the fused parameter stale.
Groups that SGLang loads member by member into shards of one parameter (qkv_proj, gate_up_proj)
need no entry.

Facts (SGLang 0.5.23 ``models/deepseek_common/deepseek_weight_loader.py`` and 0.5.15.post1
``models/deepseek_v2.py``): with ``q_lora_rank`` set, DeepSeek-V2/V3's loader concatenates
``q_a_proj`` and ``kv_a_proj_with_mqa`` (weights, and FP8 ``weight_scale_inv`` alike) into
``fused_qkv_a_proj_with_mqa`` once both halves are cached.

Users: `weight_export.bucket_by_bytes` keeps every fused set in one bucket, and the local engine
refuses an update that carries a member without its partners (`lone_members`).
"""

from __future__ import annotations

from typing import Callable, Iterable

_MLA_A_PROJ = ("self_attn.q_a_proj.", "self_attn.kv_a_proj_with_mqa.")


def _mla_groups(hf_config: dict) -> tuple:
    """DeepSeek-style MLA: the two down projections are fused when queries are low-rank."""
    return (_MLA_A_PROJ,) if hf_config.get("q_lora_rank") is not None else ()


FUSED_GROUPS: dict[str, Callable[[dict], tuple]] = {
    "DeepseekV2ForCausalLM": _mla_groups,
    "DeepseekV3ForCausalLM": _mla_groups,
}


def fused_groups(hf_config: dict) -> tuple:
    """The fused groups of `hf_config` (empty for architectures SGLang fuses nothing of)."""
    archs = hf_config.get("architectures") or [None]
    rule = FUSED_GROUPS.get(archs[0])
    return tuple(rule(hf_config)) if rule else ()


def fused_set(name: str, groups: Iterable[tuple]) -> tuple[str, ...]:
    """Every checkpoint name fused with `name` (itself included, in group order); () if none."""
    for group in groups:
        for fragment in group:
            if fragment in name:
                return tuple(name.replace(fragment, other, 1) for other in group)
    return ()


def lone_members(names: Iterable[str], groups: Iterable[tuple]) -> list[tuple[str, list[str]]]:
    """``[(name, missing partner names)]`` for every name in `names` whose fused set is incomplete."""
    groups = tuple(groups)
    present = set(names)
    out = []
    for name in present:
        missing = [other for other in fused_set(name, groups) if other not in present]
        if missing:
            out.append((name, missing))
    return sorted(out)
