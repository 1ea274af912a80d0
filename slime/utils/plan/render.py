"""Text rendering of the ``--dry-run`` plan: one titled section per part, ``key : value`` lines
aligned within a section, memory in GiB, and one ``verdict`` line per budget checked."""

from __future__ import annotations

from slime.utils.plan.memory import FRAGMENTATION, GIB
from slime.utils.plan.plan import Plan

KEY_WIDTH = 28


def _gib(n: float) -> str:
    return f"{n / GIB:8.2f} GiB"


def _params(n: float) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _section(title: str, rows: list[tuple[str, str]]) -> str:
    lines = [f"== {title} " + "=" * max(0, 60 - len(title))]
    lines += [f"  {key:<{KEY_WIDTH}}: {value}" for key, value in rows]
    return "\n".join(lines)


def _span(ids: list[int]) -> str:
    """GPU ids as "a-b" when consecutive, else comma-separated."""
    if not ids:
        return "-"
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def verdict(used: int, budget: int) -> str:
    """Return "fits (...)" or "OVER BUDGET (...)" with the margin; a fit under 10% free is tight."""
    if used <= budget:
        tight = "; tight: under 10% free, measure it" if budget - used < 0.1 * budget else ""
        return f"fits ({used / GIB:.1f} of {budget / GIB:.1f} GiB, {(budget - used) / GIB:.1f} GiB free{tight})"
    return f"OVER BUDGET ({used / GIB:.1f} of {budget / GIB:.1f} GiB, {(used - budget) / GIB:.1f} GiB over)"


def _placement(plan: Plan) -> str:
    p = plan.placement
    rows = [("mode", "colocated (trainer offloads while engines generate)" if p.colocated else
             "disaggregated (actor GPUs first, then critic, then rollout GPUs)"
             if p.critic_gpus else "disaggregated (actor GPUs first, then rollout GPUs)"),
            ("GPUs", f"{p.total_gpus} on {p.num_nodes} node(s) x {p.gpus_per_node}"),
            ("trainer GPUs", _span(p.trainer_gpus))]
    if p.critic_gpus:
        rows.append(("critic GPUs", _span(p.critic_gpus)))
    if p.engines:
        e = p.engines[0]
        rows.append(("engines", f"{len(p.engines)} x {len(e.gpus)} GPUs (tp {e.tp}, dp-attention {e.dp}, ep {e.ep})"))
    for node in range(p.num_nodes):
        gpus = [g for g in range(p.total_gpus) if p.node_of(g) == node]
        ranks = [g for g in p.trainer_gpus if p.node_of(g) == node]
        critic = [g for g in p.critic_gpus if p.node_of(g) == node]
        engines = [f"engine {e.index} [{_span(e.gpus)}]" for e in p.engines if p.node_of(e.gpus[0]) == node]
        rows.append((f"node {node} (GPUs {_span(gpus)})",
                     f"trainer ranks {_span(ranks)}; " + (f"critic GPUs {_span(critic)}; " if critic else "")
                     + (", ".join(engines) or "no engine")))
    return _section("Placement", rows)


def _layout(plan: Plan) -> str:
    lay = plan.layout
    rows = [("world size", str(lay.world_size)),
            ("TP / PP / CP", f"{lay.tp} / {lay.pp} / {lay.cp}"),
            ("sequence parallel", "on" if lay.sequence_parallel else "off"),
            ("DP = world/(TP*PP*CP)", str(lay.dp)),
            ("EP / ETP", f"{lay.ep} / {lay.etp}"),
            ("expert-DP = world/(PP*EP*ETP)", str(lay.expert_dp)),
            ("rank order", "megatron default tp-cp-ep-dp-pp (first varies fastest)")]
    for kind, groups in lay.groups.items():
        more = " ..." if lay.num_groups[kind] > len(groups) else ""
        rows.append((f"{kind} groups ({lay.num_groups[kind]})", " ".join(str(g) for g in groups) + more))
    return _section("Parallel layout", rows)


def _batch(plan: Plan) -> str:
    b = plan.batch
    micro = (f"dynamic: at most {b.max_tokens_per_gpu} tokens per micro-batch; <= {b.micro_batches} "
             f"micro-batches per step per DP rank at max length {b.max_seq_len}"
             if b.dynamic else f"{b.micro_batches} per step per DP rank")
    rows = [("prompts per rollout", str(b.prompts_per_rollout)),
            ("samples per rollout", str(b.samples_per_rollout)),
            ("global batch size", str(b.global_batch_size)),
            ("optimizer steps per rollout", str(b.steps_per_rollout)),
            ("samples per step per DP rank", str(b.samples_per_dp_rank)),
            ("micro-batches", micro),
            ("over-sampling batch size", str(b.over_sampling_batch_size or "off"))]
    rows += [("note", n) for n in b.notes]
    return _section("Batch arithmetic", rows)


def _trainer(plan: Plan) -> str:
    m = plan.trainer
    rows = [("model parameters", f"{_params(plan.params.total)} total ({_params(plan.params.expert)} in experts), "
             f"{_params(plan.active_params)} active per token"),
            ("worst pipeline stage", str(m.stage)),
            ("parameters per GPU", f"{_params(m.dense_params)} dense + {_params(m.expert_params)} expert"),
            ("optimizer shard", f"{_params(m.owned_params)} params ({m.optimizer_sharding})"),
            ("recompute", plan.recompute),
            ("tokens per micro-batch", str(m.tokens))]
    notes = {"allocator fragmentation": f"  ({FRAGMENTATION:.0%} of the tensors above)"}
    rows += [(name, _gib(b) + notes.get(name, "")) for name, b in m.parts.items()]
    if m.optimizer_on_cpu:
        rows.append(("optimizer states on CPU", _gib(m.optimizer_on_cpu) + "  (host RAM, not in the total)"))
    rows += [("total", _gib(m.total)), ("trainer verdict", verdict(m.total, m.budget))]
    return _section("Memory per trainer GPU", rows)


def _critic(plan: Plan) -> str:
    c = plan.critic
    lay, m = c.layout, c.memory
    rows = [("GPUs", f"{_span(c.gpus)} (world {lay.world_size}, TP {lay.tp} / PP {lay.pp} / CP {lay.cp}, "
             f"DP {lay.dp}, EP {lay.ep})"),
            ("parameters per GPU", f"{_params(m.dense_params)} dense + {_params(m.expert_params)} expert "
             "(output layer counted at vocabulary size)")]
    rows += [(name, _gib(b)) for name, b in m.parts.items()]
    rows += [("total", _gib(m.total)), ("critic verdict", verdict(m.total, m.budget))]
    return _section("Critic (ppo value model) memory per GPU", rows)


def _host(plan: Plan) -> str:
    h = plan.host
    if h is None:
        return _section("Host RAM per node (CPU Adam)", [("CPU Adam", "off (no --optimizer-cpu-offload)")])
    rows = [("bytes per owned parameter", f"{h.bytes_per_param} (fp32 master + Adam moments + fp32 grad)"),
            ("per trainer rank", _gib(h.per_rank)),
            ("ranks per node", str(h.ranks_per_node)),
            ("per node", _gib(h.per_node))]
    rows.append(("host verdict", "not checked (set --host-memory-gib)" if h.budget is None
                 else verdict(h.per_node, h.budget)))
    return _section("Host RAM per node (CPU Adam)", rows)


def _engine(plan: Plan) -> str:
    e = plan.engine
    if e is None:
        return _section("Engine memory", [("engines", "none")])
    rows = [("static pool", f"{_gib(e.reserved)}  (--sglang-mem-fraction-static {e.mem_fraction})"),
            ("weights per GPU", f"{_gib(e.weights)}  ({e.weight_dtype}, attention tp {e.attention_tp})"),
            ("KV-cache room per GPU", _gib(e.kv_room)),
            ("KV bytes per token per GPU", str(e.kv_bytes_per_token)),
            ("KV tokens per GPU", f"{e.kv_tokens_per_gpu:,}"),
            ("engine verdict", "fits" if e.fits else "OVER BUDGET (weights exceed the static pool)")]
    return _section("Engine memory", rows)


HAND_OVER = ("engines release weights + KV cache + CUDA graphs -> trainer onloads -> train -> "
             "trainer offloads optimizer + grads -> engines resume weights -> weight sync -> "
             "trainer offloads weights -> engines resume KV cache + CUDA graphs -> rollout")


def _timeline(plan: Plan) -> str:
    if plan.timeline is None:
        return _section("Colocated timeline per GPU", [("hand-over", "none (not colocated)")])
    rows = [("hand-over per rollout", HAND_OVER)]
    for number, phase in enumerate(plan.timeline, 1):
        rows.append((f"{number}. {phase.name}", _gib(phase.total).strip()))
        rows += [(f"   {name}", _gib(b)) for name, b in phase.parts.items()]
        rows.append(("   verdict", verdict(phase.total, phase.budget)))
    return _section("Colocated timeline per GPU", rows)


def render_plan(plan: Plan) -> str:
    """Human-readable plan: Placement, Parallel layout, Batch arithmetic, Memory per trainer GPU,
    (with ppo) Critic memory per GPU, Host RAM per node, Engine memory, Colocated timeline per GPU,
    Features (layer spec, GPU-only and refused flags), megatron-core configs (the config objects
    the entry point built, when it set them), Warnings. Contains no secrets (none are in
    the plan)."""
    warnings = [("warning", w) for w in plan.warnings] or [("warnings", "none")]
    features = plan.features or [("features", "none")]
    parts = [_placement(plan), _layout(plan), _batch(plan), _trainer(plan)]
    parts += [_critic(plan)] if plan.critic is not None else []
    parts += [_host(plan), _engine(plan), _timeline(plan), _section("Features", features)]
    parts += [_section("megatron-core configs", plan.megatron_configs)] if plan.megatron_configs else []
    parts += [_section("Warnings", warnings)]
    return "\n\n".join(parts) + "\n"
