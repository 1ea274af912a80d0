"""`--apply-chat-template` needs a chat template in the tokenizer of `--hf-checkpoint`: read from
its files (tokenizer_config.json's `chat_template`, chat_template.jinja or chat_template.json)
without loading the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from slime.utils.preflight.report import Report

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def has_chat_template(folder: Path) -> bool:
    """Whether the tokenizer files in `folder` define a chat template."""
    if any((folder / name).is_file() for name in TEMPLATE_FILES):
        return True
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return False
    return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))


def check_chat_template(args, report: Report) -> None:
    """With `--apply-chat-template` (train or any eval dataset), `--hf-checkpoint` has a template."""
    wanted = getattr(args, "apply_chat_template", False) or any(
        d.apply_chat_template for d in getattr(args, "eval_datasets", None) or [])
    hf = getattr(args, "hf_checkpoint", None)
    if not wanted:
        return
    if not hf:
        report.error("--apply-chat-template", "needs --hf-checkpoint (the tokenizer whose chat template it applies)")
        return
    if not report.missing("--hf-checkpoint", hf):
        return
    if not any((Path(hf) / name).is_file() for name in ("tokenizer_config.json", *TEMPLATE_FILES)):
        missing = f"{hf}: no tokenizer files (tokenizer_config.json) for --apply-chat-template"
        (report.warn if report.dry_run else report.error)("--hf-checkpoint", missing)
        return
    try:
        found = has_chat_template(Path(hf))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        report.error("--hf-checkpoint", f"{hf}/tokenizer_config.json: not valid JSON ({e})")
        return
    if not found:
        report.error("--apply-chat-template", f"the tokenizer in --hf-checkpoint {hf} has no chat template "
                     "(no chat_template in tokenizer_config.json, no chat_template.jinja)",
                     "drop --apply-chat-template for plain-text prompts, or use a tokenizer with a template")
