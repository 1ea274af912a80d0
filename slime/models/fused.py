"""Checkpoint tensors that SGLang fuses on load, so they must reach it in the same weight update.

Owns the matching of fused groups. A group is a tuple of name fragments; checkpoint names that
differ only in which fragment they contain are one fused set (e.g.
``model.layers.3.self_attn.q_a_proj.weight`` and ``model.layers.3.self_attn.kv_a_proj_with_mqa.weight``).
Each family declares its groups (``ModelFamily.fused_groups``, e.g. `slime.models.deepseek_v3`);
`slime.models.registry.fused_groups` gives those of a config. Only groups whose members SGLang
*caches until every member arrived in the same* ``load_weights`` *call* are listed: SGLang drops a
member whose partner comes in another call, without an error, leaving the fused parameter stale.
Groups that SGLang loads member by member into shards of one parameter (qkv_proj, gate_up_proj)
need no entry.

Users: `weight_export.bucket_by_bytes` keeps every fused set in one bucket, and the local engine
refuses an update that carries a member without its partners (`lone_members`).
"""

from __future__ import annotations

from typing import Iterable


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
