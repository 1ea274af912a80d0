"""Eval domain: evaluation datasets, cadence and sampling parameters (None falls back to the
matching rollout value)."""

from __future__ import annotations

import argparse

import yaml

from slime.utils.eval_config import build_eval_dataset_configs, load_eval_config
from slime.utils.arguments.common import DEFAULT_ROLLOUT_FUNCTION, ArgumentError, check_path_exists, positive_int, require, strip_slice

# eval dest -> rollout dest it falls back to when left at None.
_FALLBACKS = {
    "eval_max_response_len": "rollout_max_response_len",
    "eval_temperature": "rollout_temperature",
    "eval_top_p": "rollout_top_p",
    "eval_top_k": "rollout_top_k",
    "eval_function_path": "rollout_function_path",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the eval flags as one argument group."""
    group = parser.add_argument_group("eval", "Evaluation datasets and sampling.")
    group.add_argument("--eval-interval", type=positive_int("--eval-interval"), default=None,
                       help="Evaluate every this many rollouts (None: never).")
    group.add_argument("--eval-prompt-data", type=str, nargs="+", default=None, metavar="NAME PATH",
                       help="Evaluation sets as NAME PATH pairs: --eval-prompt-data aime a.jsonl gsm8k g.jsonl; "
                       "a lone PATH is the set named aime, as in slime.")
    group.add_argument("--n-samples-per-eval-prompt", type=positive_int("--n-samples-per-eval-prompt"), default=1,
                       help="Responses sampled per evaluation prompt.")
    group.add_argument("--eval-max-response-len", type=int, default=None,
                       help="Maximum new tokens at evaluation (None: --rollout-max-response-len).")
    group.add_argument("--eval-temperature", type=float, default=None,
                       help="Temperature at evaluation (None: --rollout-temperature).")
    group.add_argument("--eval-top-p", type=float, default=None, help="Top-p at evaluation (None: --rollout-top-p).")
    group.add_argument("--eval-top-k", type=int, default=None, help="Top-k at evaluation (None: --rollout-top-k).")
    group.add_argument("--skip-eval-before-train", action="store_true", default=False,
                       help="Do not evaluate the initial model before the first rollout.")
    group.add_argument("--eval-function-path", type=str, default=None,
                       help="Rollout function called with evaluation=True (None: --rollout-function-path).")
    group.add_argument("--eval-config", type=str, default=None,
                       help="YAML/JSON file of per-dataset eval settings ({defaults, datasets: [{name, path, "
                       "...}]}, optionally under an 'eval' key); replaces --eval-prompt-data. See docs/plugins.md.")
    group.add_argument("--eval-input-key", type=str, default=None, help="Prompt key of eval data (None: --input-key).")
    group.add_argument("--eval-label-key", type=str, default=None, help="Label key of eval data (None: --label-key).")
    group.add_argument("--eval-tool-key", type=str, default=None, help="Tools key of eval data (None: --tool-key).")
    group.add_argument("--eval-min-new-tokens", type=int, default=None,
                       help="SGLang min_new_tokens at evaluation (None: not sent).")


def eval_datasets(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Return ``--eval-prompt-data`` as [(name, path), ...] (empty when not given); the one
    definition of the eval-dataset list (flat NAME PATH pairs, or already-paired items)."""
    items = args.eval_prompt_data or []
    if items and isinstance(items[0], (list, tuple)):
        return [(str(x[0]), str(x[1])) for x in items]
    return [(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]


def evaluates(args: argparse.Namespace) -> bool:
    """Whether evaluation runs at all: `--eval-interval` with eval data, or with an
    `--eval-function-path` of the user's own (which may bring its data itself)."""
    if not args.eval_interval:
        return False
    custom_fn = args.eval_function_path not in (None, DEFAULT_ROLLOUT_FUNCTION)
    return bool(args.eval_prompt_data) or custom_fn


def _eval_config_datasets(args: argparse.Namespace, warnings: list[str]) -> list[dict]:
    """Datasets of `--eval-config` (its `defaults` applied), or of `--eval-prompt-data`."""
    if args.eval_config:
        if not check_path_exists(args, "--eval-config", args.eval_config, warnings):
            return []
        try:
            datasets, defaults = load_eval_config(args.eval_config)
        except (ValueError, OSError) as e:
            raise ArgumentError(str(e)) from e
        except yaml.YAMLError as e:  # the parser's message spans lines: its first names the problem
            raise ArgumentError(f"--eval-config {args.eval_config}: not valid YAML ({str(e).splitlines()[0]})") from e
        if args.eval_prompt_data:
            warnings.append("--eval-config replaces --eval-prompt-data")
        return [{**defaults, **d} for d in datasets]
    if args.eval_prompt_data is not None and len(args.eval_prompt_data) == 1:
        args.eval_prompt_data = ["aime", args.eval_prompt_data[0]]  # slime: a lone PATH is "aime"
    if args.eval_prompt_data is not None:
        require(len(args.eval_prompt_data) % 2 == 0,
                f"--eval-prompt-data takes NAME PATH pairs, got {len(args.eval_prompt_data)} values: "
                f"{args.eval_prompt_data}")
    return [{"name": name, "path": path} for name, path in eval_datasets(args)]


def validate(args: argparse.Namespace) -> list[str]:
    """--eval-config or --eval-prompt-data (NAME PATH pairs; a lone PATH is named aime) whose paths
    exist; --eval-max-response-len, --eval-temperature, --eval-top-p, --eval-top-k and
    --eval-function-path default to their rollout counterparts. Sets `args.eval_datasets`
    (EvalDatasetConfig list, every field resolved) and, from --eval-config, `args.eval_prompt_data`."""
    warnings: list[str] = []
    datasets = _eval_config_datasets(args, warnings)
    for d in datasets:
        check_path_exists(args, f"--eval-prompt-data {d.get('name')}", strip_slice(str(d.get("path"))), warnings)
    if not datasets and args.eval_interval is not None:
        warnings.append("--eval-interval given without --eval-prompt-data: only a custom "
                        "--eval-function-path can evaluate")
    for eval_dest, rollout_dest in _FALLBACKS.items():
        if getattr(args, eval_dest) is None:
            setattr(args, eval_dest, getattr(args, rollout_dest))
    require(args.eval_temperature > 0, f"--eval-temperature must be > 0, got {args.eval_temperature}")
    try:
        args.eval_datasets = build_eval_dataset_configs(args, datasets)
    except (ValueError, TypeError) as e:
        raise ArgumentError(str(e)) from e
    if args.eval_config:
        args.eval_prompt_data = [x for c in args.eval_datasets for x in (c.name, c.path)]
    return warnings
