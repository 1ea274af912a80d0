"""`--eval-config`: per-dataset evaluation settings (slime's `EvalDatasetConfig`).

A YAML or JSON file whose root, or its `eval` key, holds `defaults` (optional) and `datasets`
(a non-empty list of mappings with `name` and `path`, or a mapping name -> settings). Every field
of a dataset is resolved once, at parse time: the dataset's value, else `defaults`, else the first
non-None of the flags listed for it in `DATASET_RUNTIME_SPECS` / `DATASET_SAMPLE_SPECS`.
The result is `args.eval_datasets` (always set, also from `--eval-prompt-data`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# field -> flags (dests) tried in order when neither the dataset nor `defaults` sets it.
DATASET_RUNTIME_SPECS: dict[str, tuple[str, ...]] = {
    "rm_type": ("rm_type",),
    "custom_rm_path": ("eval_custom_rm_path", "custom_rm_path"),
    "input_key": ("eval_input_key", "input_key"),
    "label_key": ("eval_label_key", "label_key"),
    "tool_key": ("eval_tool_key", "tool_key"),
    "metadata_key": ("metadata_key",),
    "apply_chat_template": ("apply_chat_template",),
    "apply_chat_template_kwargs": ("apply_chat_template_kwargs",),
    "n_samples_per_eval_prompt": ("n_samples_per_eval_prompt", "n_samples_per_prompt"),
    "custom_generate_function_path": ("custom_generate_function_path",),
}
DATASET_SAMPLE_SPECS: dict[str, tuple[str, ...]] = {
    "temperature": ("eval_temperature", "rollout_temperature"),
    "top_p": ("eval_top_p", "rollout_top_p"),
    "top_k": ("eval_top_k", "rollout_top_k"),
    "max_response_len": ("eval_max_response_len", "rollout_max_response_len"),
    "stop": ("rollout_stop",),
    "stop_token_ids": ("rollout_stop_token_ids",),
    "min_new_tokens": ("eval_min_new_tokens",),
    "skip_special_tokens": ("rollout_skip_special_tokens",),
}


@dataclass
class EvalDatasetConfig:
    """One evaluation dataset and its resolved settings (None: not set anywhere)."""

    name: str
    path: str
    rm_type: str | None = None
    custom_rm_path: str | None = None
    input_key: str | None = None
    label_key: str | None = None
    tool_key: str | None = None
    metadata_key: str | None = None
    multimodal_keys: Any = None
    apply_chat_template: bool | None = None
    apply_chat_template_kwargs: Any = None
    n_samples_per_eval_prompt: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_response_len: int | None = None
    stop: list | None = None
    stop_token_ids: list | None = None
    min_new_tokens: int | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    custom_generate_function_path: str | None = None
    eval_task_timeout: float | None = None
    min_eval_samples: int | None = None
    metadata_overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.name or not self.path:
            raise ValueError(f"--eval-config: every dataset needs a name and a path, got {self.name!r}, {self.path!r}")
        if self.min_eval_samples is not None and self.min_eval_samples <= 0:
            raise ValueError(f"--eval-config dataset {self.name!r}: min_eval_samples must be > 0")

    @property
    def cache_key(self) -> tuple:
        """What identifies the loaded prompts: name, path and the keys that shape them."""
        return (self.name, self.path, self.input_key, self.label_key, self.tool_key, self.metadata_key)

    def inject_metadata(self, metadata: dict | None) -> dict:
        """A copy of a sample's metadata with this dataset's rm_type and overrides applied."""
        out = dict(metadata or {})
        if self.rm_type is not None:
            out["rm_type"] = self.rm_type
        out.update(self.metadata_overrides)
        return out


_FIELDS = {f.name for f in dataclasses.fields(EvalDatasetConfig)}


def ensure_dataset_list(raw) -> list[dict]:
    """`datasets` as a list of mappings: a list (entries need `name`) or a mapping name -> settings."""
    if isinstance(raw, dict):
        return [{"name": name, **(cfg or {})} for name, cfg in raw.items()]
    if not isinstance(raw, list) or not all(isinstance(d, dict) and "name" in d for d in raw):
        raise ValueError("--eval-config: datasets must be a mapping or a list of mappings with a 'name'")
    return [dict(d) for d in raw]


def pick_from_args(args, dests: tuple[str, ...]) -> Any:
    """The first non-None `args.<dest>` of `dests` (None when all are None or absent)."""
    return next((getattr(args, d) for d in dests if getattr(args, d, None) is not None), None)


def build_eval_dataset_configs(args, raw, defaults: dict | None = None) -> list[EvalDatasetConfig]:
    """Resolve every dataset of `raw` (see `ensure_dataset_list`) against `defaults` and `args`."""
    defaults = dict(defaults or {})
    unknown = sorted(set(defaults) - _FIELDS)
    if unknown:
        raise ValueError(f"--eval-config: unknown keys in defaults: {unknown}")
    out = []
    for entry in ensure_dataset_list(raw):
        extra = sorted(set(entry) - _FIELDS)
        if extra:
            raise ValueError(f"--eval-config dataset {entry.get('name')!r}: unknown keys {extra}")
        values = {**defaults, **{k: v for k, v in entry.items() if v is not None}}
        for name, dests in {**DATASET_RUNTIME_SPECS, **DATASET_SAMPLE_SPECS}.items():
            if values.get(name) is None:
                values[name] = pick_from_args(args, dests)
        out.append(EvalDatasetConfig(**values))
    return out


def load_eval_config(path: str) -> tuple[list[dict], dict]:
    """(datasets, defaults) from a YAML / JSON `--eval-config` file."""
    import yaml

    with open(path, encoding="utf-8") as f:
        root = yaml.safe_load(f) or {}
    if isinstance(root, dict) and isinstance(root.get("eval"), dict):
        root = root["eval"]
    datasets = root.get("datasets") if isinstance(root, dict) else None
    if not datasets:
        raise ValueError(f"--eval-config {path}: no datasets (expected a non-empty 'datasets' list)")
    return ensure_dataset_list(datasets), dict(root.get("defaults") or {})
