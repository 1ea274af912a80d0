"""Every flag does something: each parser dest is read by code outside the arguments package and
the dry-run planner, or sits in one of the explicit lists below with its reason.

A dest counts as read when a module other than `slime/utils/arguments/` and `slime/utils/plan/`
(the package, `train.py`, `train_async.py`, `tools/`) contains `args.<dest>` (any `...args.<dest>`),
`getattr(<obj>, "<dest>"` or the string `"<dest>"` (a dest-keyed table such as
`config._TRANSFORMER_FIELDS` or `plugins` signatures), or when `<dest>` is a field of a dataclass
built from args by field name (a `from_args` that reads `__dataclass_fields__`, e.g. `SinkConfig`).
The passthrough is not scanned: SGLang's ServerArgs as `--sglang-*` (slime's own `--sglang-*` flags
are) and the `--router-*` flags (handed to sglang-router by prefix); the SGLang and router launch
tests check those.
Flags added later are checked by the same scan when they land.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from slime.utils.arguments import ArgumentError, build_parser, parse_args
from slime.utils.arguments.sglang import RENAMED_FIELDS, passthrough_fields, union_server_arg_fields
from tests.conftest import REPO_ROOT

EXCLUDED_DIRS = ("slime/utils/arguments/", "slime/utils/plan/")
ROUTER_PREFIX = "router_"

# Inputs of the dry-run planner only (`--dry-run` prints memory estimates from them).
PLANNER_INPUTS = {
    "gpu_memory_gib": "device memory the --dry-run memory plan budgets against",
    "host_memory_gib": "host memory the --dry-run memory plan budgets against",
}
# Resolved at parse time into another dest that the code reads (dest -> the dest it becomes).
RESOLVED_INTO = {
    "use_rotary_position_embeddings": "position_embedding_type",
    "eval_prompt_data": "eval_datasets",
    "eval_config": "eval_datasets",
}
# Refused at parse time, with an error naming the flag, for every value but the default (which is
# what the code does anyway): dest -> an argv that is refused.
REFUSED = {
    "ckpt_format": ["--ckpt-format", "torch"],  # checkpoints are torch_dist, the default, only
}
# Whole effect at parse time or outside slime's code (dest -> why nothing else reads it).
PARSE_TIME_ONLY = {
    "sglang_config": "its YAML items are merged into argv as --sglang-* flags before parsing",
    "custom_config_path": "its YAML keys are set on args after parsing, before validation",
    "add_position_embedding": "Megatron-LM's legacy switch: accepted only where it changes nothing, else refused",
    "post_self_attn_layernorm": "read by the user's --spec function (which gets args), not by slime",
    "post_mlp_layernorm": "read by the user's --spec function (which gets args), not by slime",
    "enable_mtp_training": "needs --mtp-num-layers, which is refused at start-up (startup_refusals)",
    "mtp_loss_scaling_factor": "needs --mtp-num-layers, which is refused at start-up (startup_refusals)",
}
# Helpers of the arguments package that the runtime reads flags through (dotted path -> why): the
# dests each one reads count as read when code outside the package calls it.
READ_THROUGH = {
    "slime.utils.arguments.critic.critic_view":
        "the PPO critic's ranks see their flags through this view (--critic-load as --load, ...)",
    "slime.utils.arguments.critic.critic_world_size": "placement sizes the critic's ranks with it",
    "slime.utils.arguments.features.startup_refusals": "train.py refuses to start on what it returns",
    "slime.utils.arguments.sglang.startup_refusals": "train.py refuses to start on what it returns",
}


def _all_dests() -> set[str]:
    dests = set()
    for entry in ("train", "train_async"):
        dests |= {a.dest for a in build_parser(entry)._actions if a.dest != "help"}
    return dests


def _sources() -> dict[str, str]:
    files = [*(REPO_ROOT / "slime").rglob("*.py"), REPO_ROOT / "train.py", REPO_ROOT / "train_async.py",
             *(REPO_ROOT / "tools").rglob("*.py")]
    out = {}
    for path in files:
        rel = path.relative_to(REPO_ROOT).as_posix()
        if not rel.startswith(EXCLUDED_DIRS):
            out[rel] = path.read_text(encoding="utf-8")
    return out


def _from_args_fields(source: str) -> set[str]:
    """Field names of dataclasses whose `from_args` reads every field from args by name."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
        if "from_args" in methods and "__dataclass_fields__" in ast.unparse(methods["from_args"]):
            names |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return names


_READ_PATTERNS = (
    re.compile(r"args\.([A-Za-z_]\w*)"),  # args.<dest>, self.args.<dest>
    re.compile(r"getattr\([^,()]+,\s*[\"']([A-Za-z_]\w*)[\"']"),  # getattr(obj, "<dest>"
    re.compile(r"[\"']([a-z_][a-z0-9_]*)[\"']"),  # "<dest>" in a dest-keyed table
)


def _names_read(sources) -> set[str]:
    names = set()
    for source in sources:
        names |= _from_args_fields(source)
        for pattern in _READ_PATTERNS:
            names.update(pattern.findall(source))
    return names


def _called_helpers() -> set[str]:
    """The READ_THROUGH helpers that code outside the arguments package and the planner calls."""
    text = "\n".join(_sources().values())
    return {h for h in READ_THROUGH if re.search(rf"\b{h.rsplit('.', 1)[1]}\(", text)}


def _read_dests(dests: set[str]) -> set[str]:
    names = _names_read(_sources().values())
    for helper in _called_helpers():  # what such a helper reads is read
        module, name = helper.rsplit(".", 1)
        names |= _names_read([inspect.getsource(getattr(importlib.import_module(module), name))])
    return dests & names


def _passthrough() -> set[str]:
    fields = {f["name"] for f in passthrough_fields(union_server_arg_fields())} | set(RENAMED_FIELDS)
    return {f"sglang_{name}" for name in fields}


def _listed(dest: str) -> bool:
    return dest in PLANNER_INPUTS or dest in RESOLVED_INTO or dest in REFUSED or dest in PARSE_TIME_ONLY


def test_every_flag_is_read_outside_the_parser_and_planner():
    dests = {d for d in _all_dests() - _passthrough() if not d.startswith(ROUTER_PREFIX)}
    unread = sorted(d for d in dests - _read_dests(dests) if not _listed(d))
    assert not unread, (f"flags read by nothing but the parser / planner: {unread}; make them do what their "
                        "help says, refuse them in validate(), or list them in tests/unit/test_flag_coverage.py "
                        "with the reason")


def test_the_explicit_lists_hold_only_real_and_still_needed_entries():
    dests = _all_dests()
    listed = {*PLANNER_INPUTS, *RESOLVED_INTO, *REFUSED, *PARSE_TIME_ONLY}
    assert listed <= dests, f"listed but not flags: {sorted(listed - dests)}"
    uncalled = set(READ_THROUGH) - _called_helpers()
    assert not uncalled, f"read-through helpers nothing outside the arguments package calls: {sorted(uncalled)}"
    read = _read_dests(dests)
    assert not (listed & read), f"listed as unread but read by the code now: {sorted(listed & read)}"
    targets = set(RESOLVED_INTO.values())
    assert _read_dests(targets) == targets, "a flag resolves into a dest nothing reads"
    planner = _names_read(p.read_text() for p in (REPO_ROOT / "slime/utils/plan").rglob("*.py"))
    assert set(PLANNER_INPUTS) <= planner, "a planner input the planner does not read"


def test_refused_flags_fail_at_parse_time_naming_the_flag():
    base = ["--rollout-batch-size", "8", "--num-rollout", "1", "--colocate", "--dry-run"]
    parse_args(base)  # valid without the refused flags
    for argv in REFUSED.values():
        with pytest.raises(ArgumentError, match=re.escape(argv[0])):
            parse_args(base + argv)
