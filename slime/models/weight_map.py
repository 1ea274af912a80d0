"""Table-driven HF <-> Megatron name and tensor mapping, and Megatron sharding.

Owns ``Rule`` (one row of a model's map: Megatron names per layout, HF names, the
tensor transform and the TP split kind), ``WeightMap`` (resolves full Megatron
names with global layer and expert ids against the rules of one HF config) and
``ShardContext`` with the functions that move between full tensors / global names
and one rank's local shards / local names (TP, EP, ETP, PP layer offset). The shared rule
machinery of every family module of `slime.models`; free of torch at import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from slime.models import transforms as tf


@dataclass(frozen=True)
class MegatronLayout:
    """Which Megatron naming to produce: TE-fused norm names, grouped-GEMM expert names."""

    te_norms: bool = False
    grouped_experts: bool = False


@dataclass(frozen=True)
class Rule:
    """One mapping row.

    ``names``: Megatron name templates; index 0 is the local-spec name, index 1 (if set)
    the TE / grouped-GEMM name. Templates use ``{layer}`` and ``{expert}``.
    ``hf``: HF name templates. ``convert``: key of ``CONVERTERS``. ``split``: key of
    ``transforms.SPLITS``. ``expert``: the tensor belongs to one expert (EP / ETP).
    """

    names: tuple
    hf: tuple
    convert: str = "copy"
    split: str = "replicated"
    expert: bool = False


def padded_vocab_size(vocab_size: int, divisible_by: int, tp_size: int) -> int:
    """Megatron-LM's padding: round ``vocab_size`` up to a multiple of ``divisible_by * tp``."""
    multiple = divisible_by * tp_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


@dataclass
class ConvertContext:
    """What the tensor converters need: attention shape, vocab sizes."""

    attention: tf.AttentionShape
    vocab_size: int
    padded_vocab_size: int


# name -> (hf tensors -> megatron tensor, megatron tensor -> hf tensors)
CONVERTERS: dict[str, tuple[Callable, Callable]] = {
    "copy": (lambda ts, ctx: ts[0], lambda t, ctx: [t]),
    "qkv": (
        lambda ts, ctx: tf.qkv_hf_to_megatron(*ts, ctx.attention),
        lambda t, ctx: list(tf.qkv_megatron_to_hf(t, ctx.attention)),
    ),
    "gate_up": (
        lambda ts, ctx: tf.gate_up_hf_to_megatron(*ts),
        lambda t, ctx: list(tf.gate_up_megatron_to_hf(t)),
    ),
    "vocab": (
        lambda ts, ctx: tf.pad_vocab(ts[0], ctx.padded_vocab_size),
        lambda t, ctx: [tf.unpad_vocab(t, ctx.vocab_size)],
    ),
}


def _template_regex(template: str) -> re.Pattern:
    pattern = re.escape(template)
    pattern = pattern.replace(r"\{layer\}", r"(?P<layer>\d+)").replace(
        r"\{expert\}", r"(?P<expert>\d+)"
    )
    return re.compile(f"^{pattern}$")


@dataclass
class WeightMap:
    """HF <-> full-Megatron mapping for one model.

    ``global_rules`` apply once, ``layer_rules(layer)`` returns the rules of a decoder
    layer (dense or MoE), ``num_layers`` / ``num_experts`` bound the ids.
    """

    global_rules: list
    layer_rules: Callable[[int], list]
    num_layers: int
    num_experts: int
    context: ConvertContext
    _index: list = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        seen = set()
        rules = list(self.global_rules)
        for layer in range(self.num_layers):
            rules.extend(r for r in self.layer_rules(layer) if id(r) not in seen)
            seen.update(id(r) for r in self.layer_rules(layer))
        for rule in dict.fromkeys(rules):
            for name in rule.names:
                if name:
                    self._index.append((_template_regex(name), rule))

    def _resolve(self, mg_name: str):
        """(rule, ids) for a full Megatron name; raises KeyError naming it when unknown."""
        for regex, rule in self._index:
            match = regex.match(mg_name)
            if match:
                ids = {k: int(v) for k, v in match.groupdict().items()}
                if "layer" in ids and rule not in self.layer_rules(ids["layer"]):
                    continue
                return rule, ids
        raise KeyError(f"no HF mapping for Megatron parameter {mg_name!r}")

    def megatron_names(self, layout: MegatronLayout = MegatronLayout()) -> list:
        """Every full Megatron parameter name of the model in ``layout``."""
        out = [self._name(rule, layout, {}) for rule in self.global_rules]
        for layer in range(self.num_layers):
            for rule in self.layer_rules(layer):
                experts = range(self.num_experts) if rule.expert else [None]
                out.extend(self._name(rule, layout, {"layer": layer, "expert": e}) for e in experts)
        return out

    @staticmethod
    def _name(rule: Rule, layout: MegatronLayout, ids: dict) -> str:
        use_alt = layout.grouped_experts if rule.expert else layout.te_norms
        name = rule.names[1] if use_alt and len(rule.names) > 1 and rule.names[1] else rule.names[0]
        return name.format(**{k: v for k, v in ids.items() if v is not None})

    def hf_names(self, mg_name: str) -> list:
        """HF names whose tensors make up Megatron parameter ``mg_name``."""
        rule, ids = self._resolve(mg_name)
        return [t.format(**ids) for t in rule.hf]

    def to_megatron(self, mg_name: str, hf_tensors: list) -> torch.Tensor:
        """Full Megatron tensor for ``mg_name`` from its HF tensors (order of ``hf_names``)."""
        rule, _ = self._resolve(mg_name)
        return CONVERTERS[rule.convert][0](list(hf_tensors), self.context)

    def to_hf(self, mg_name: str, tensor: torch.Tensor) -> list:
        """``[(hf_name, tensor), ...]`` for a full Megatron tensor."""
        rule, _ = self._resolve(mg_name)
        tensors = CONVERTERS[rule.convert][1](tensor, self.context)
        return list(zip(self.hf_names(mg_name), tensors))

    def split_kind(self, mg_name: str) -> str:
        """TP split kind (``transforms.SPLITS`` key) of ``mg_name``."""
        return self._resolve(mg_name)[0].split

    def is_expert(self, mg_name: str) -> bool:
        """Whether ``mg_name`` is a per-expert tensor (sharded by EP, split by ETP)."""
        return self._resolve(mg_name)[0].expert


@dataclass(frozen=True)
class ShardContext:
    """One rank's position: TP, EP and expert-TP ranks / sizes and its first layer id."""

    tp_rank: int = 0
    tp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1
    layer_offset: int = 0
    num_experts: int = 0

    @property
    def num_local_experts(self) -> int:
        """Experts held by this EP rank."""
        return self.num_experts // self.ep_size


_LAYER = re.compile(r"(^|\.)(layers\.)(\d+)(\.)")
_LOCAL_EXPERT = re.compile(r"(\.local_experts\.)(\d+)(\.)")
_GROUPED_EXPERT = re.compile(r"(\.experts\.linear_fc[12]\.(?:weight|bias))(\d+)$")


def _sub_id(regex: re.Pattern, name: str, group: int, fn: Callable[[int], int]) -> str:
    def repl(match):
        parts = list(match.groups())
        parts[group] = str(fn(int(parts[group])))
        return "".join(parts)

    return regex.sub(repl, name, count=1)


def global_name(local: str, ctx: ShardContext) -> str:
    """Local parameter name on this rank -> full-model name (global layer / expert ids)."""
    name = _sub_id(_LAYER, local, 2, lambda i: i + ctx.layer_offset)
    offset = ctx.ep_rank * ctx.num_local_experts
    name = _sub_id(_LOCAL_EXPERT, name, 1, lambda i: i + offset)
    return _sub_id(_GROUPED_EXPERT, name, 1, lambda i: i + offset)


def local_name(name: str, ctx: ShardContext, num_local_layers: int) -> Optional[str]:
    """Full-model name -> this rank's local name, or None when another rank holds it."""
    ids = [int(m.group(3)) for m in _LAYER.finditer(name)]
    if ids and not ctx.layer_offset <= ids[0] < ctx.layer_offset + num_local_layers:
        return None
    expert = _LOCAL_EXPERT.search(name) or _GROUPED_EXPERT.search(name)
    if expert:
        owner = int(expert.group(2)) // ctx.num_local_experts
        if owner != ctx.ep_rank:
            return None
    offset = ctx.ep_rank * ctx.num_local_experts
    local = _sub_id(_LAYER, name, 2, lambda i: i - ctx.layer_offset)
    local = _sub_id(_LOCAL_EXPERT, local, 1, lambda i: i - offset)
    return _sub_id(_GROUPED_EXPERT, local, 1, lambda i: i - offset)


def shard_tensor(wmap: WeightMap, name: str, full: torch.Tensor, ctx: ShardContext):
    """This rank's shard of the full Megatron tensor ``name`` (TP or expert-TP split)."""
    if wmap.is_expert(name):
        return tf.split_for_tp(wmap.split_kind(name), full, ctx.etp_rank, ctx.etp_size)
    return tf.split_for_tp(wmap.split_kind(name), full, ctx.tp_rank, ctx.tp_size)


def gather_tensor(wmap: WeightMap, name: str, shards: list) -> torch.Tensor:
    """Full Megatron tensor ``name`` from the shards of all (expert-)TP ranks in rank order."""
    return tf.merge_from_tp(wmap.split_kind(name), shards)
