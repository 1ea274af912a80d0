"""`--custom-config-path YAML` (slime's): a mapping whose keys override the parsed arguments.

Applied by `parse_args` after argparse and before the domain validators, so overridden flags are
validated like typed ones. A key that is a flag's dest (`rollout_batch_size`) replaces its value:
a YAML string goes through the flag's type, and the flag's choices are checked. Any other key is
set on `args` as it is, as slime does, for plugins that read their own settings from `args`.
"""

from __future__ import annotations

import argparse

from slime.utils.arguments.common import ArgumentError, require


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("custom_config", "slime's --custom-config-path: YAML overrides of the parsed arguments.")
    group.add_argument("--custom-config-path", type=str, default=None, metavar="YAML",
                       help="YAML mapping whose keys override the parsed arguments (flag dests are converted "
                       "and checked; other keys are set on args for plugins).")


def validate(args: argparse.Namespace) -> list[str]:
    return []


def _read(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as error:
        raise ArgumentError(f"--custom-config-path {path}: cannot read it as YAML ({error})") from error
    data = {} if data is None else data
    require(isinstance(data, dict) and all(isinstance(k, str) for k in data),
            f"--custom-config-path {path}: expected a mapping of name: value, got {type(data).__name__}")
    return data


def _value(action: argparse.Action, key: str, value, path: str):
    if isinstance(value, str) and callable(action.type):
        try:
            value = action.type(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
            raise ArgumentError(f"--custom-config-path {path}: {key}: {error}") from error
    if action.choices is not None and value not in action.choices:
        raise ArgumentError(f"--custom-config-path {path}: {key} must be one of {list(action.choices)}, "
                            f"got {value!r}")
    return value


def apply_custom_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Set every key of `args.custom_config_path` (if given) on `args`, in place."""
    path = args.custom_config_path
    if not path:
        return
    actions = {a.dest: a for a in parser._actions}  # argparse keeps no public dest -> action table
    for key, value in _read(path).items():
        setattr(args, key, _value(actions[key], key, value, path) if key in actions else value)
