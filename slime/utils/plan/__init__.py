"""``--dry-run`` plan: placement, parallel layout, batch arithmetic and a memory model per GPU
and per node, built from parsed arguments without touching torch, megatron or ray.

Public API: ``build_plan(args) -> Plan`` and ``render_plan(plan) -> str``.
"""

from slime.utils.plan.plan import Plan, build_plan
from slime.utils.plan.render import render_plan

__all__ = ["Plan", "build_plan", "render_plan"]
