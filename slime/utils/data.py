"""Prompt data: reading JSONL / Parquet prompt files, turning rows into Samples, the prompt Dataset.

Owns `--prompt-data` parsing (file type by extension, optional `@[start:end]` slice), per-row
validation with file/line error messages, prompt construction (chat template, tools, metadata;
docs/slime-compat.md §5), the over-long prompt filter, the cached tokenizer loader and the
`Dataset` that reshuffles per epoch with seed `rollout_seed + epoch`.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import re
from pathlib import Path
from typing import Any

from slime.utils.types import Sample

logger = logging.getLogger(__name__)

_SLICE_RE = re.compile(r"^(?P<path>.+)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str):
    """The Hugging Face tokenizer at `path` (an `--hf-checkpoint` dir), loaded once per path."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=True)


def parse_data_path(path_with_slice: str) -> tuple[str, slice]:
    """Split "file.jsonl@[start:end]" into ("file.jsonl", slice(start, end)); no suffix -> [:]."""
    match = _SLICE_RE.match(str(path_with_slice))
    if match is None:
        return str(path_with_slice), slice(None)
    start, end = match["start"], match["end"]
    return match["path"], slice(int(start) if start else None, int(end) if end else None)


def _read_jsonl(path: str) -> list[tuple[str, dict]]:
    """(location, row) pairs; location is "file:line" with the 1-based physical line number."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: malformed JSON line in --prompt-data: {e.msg}") from e
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            out.append((where, row))
    return out


def _read_parquet(path: str) -> list[tuple[str, dict]]:
    """(location, row) pairs; location is "file row N" with the 1-based row number."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    return [(f"{path} row {i}", row) for i, row in enumerate(rows, start=1)]


# Registry: file extension -> reader returning (location, row) pairs.
_READERS = {".jsonl": _read_jsonl, ".parquet": _read_parquet}


def _read_located_rows(path_with_slice: str, input_key: str | None) -> list[tuple[str, dict]]:
    path, sl = parse_data_path(path_with_slice)
    suffix = Path(path).suffix.lower()
    if suffix not in _READERS:
        raise ValueError(
            f"--prompt-data {path_with_slice!r}: unsupported file type {suffix!r} "
            f"(expected one of {sorted(_READERS)})"
        )
    if not Path(path).is_file():
        raise FileNotFoundError(f"--prompt-data file {path!r} does not exist")
    located = _READERS[suffix](path)[sl]
    if input_key is not None:
        for where, row in located:
            if row.get(input_key) is None:
                raise KeyError(
                    f"{where}: row has no --input-key {input_key!r} (missing or null; "
                    f"keys: {sorted(row)})"
                )
    return located


def load_prompt_rows(path_with_slice: str, *, input_key: str | None = None) -> list[dict]:
    """Read the rows of a JSONL or Parquet prompt file, optionally sliced by `@[start:end]`.

    The slice has Python semantics (either side optional, negatives allowed) and applies to rows
    (blank JSONL lines are not rows). A malformed JSONL line raises ValueError naming the file and
    1-based line. With `input_key`, a kept row lacking it raises KeyError naming the key, file and
    line (Parquet: 1-based row number); a null value counts as missing.
    """
    return [row for _, row in _read_located_rows(path_with_slice, input_key)]


def read_file(path_with_slice: str):
    """slime's reader: yield the rows of a `.jsonl` / `.parquet` file, optionally `@[start:end]`.

    A generator, as in slime. Blank lines are skipped; a malformed JSONL line is logged and
    skipped (the trainer's own `--prompt-data` loading, `load_prompt_rows`, raises instead). A
    missing file raises FileNotFoundError, another extension ValueError.
    """
    path, sl = parse_data_path(path_with_slice)
    suffix = Path(path).suffix.lower()
    if suffix not in _READERS:
        raise ValueError(f"read_file {path_with_slice!r}: unsupported file type {suffix!r} (expected .jsonl or .parquet)")
    if not Path(path).is_file():
        raise FileNotFoundError(f"read_file: {path!r} does not exist")
    if suffix == ".parquet":
        rows = [row for _, row in _read_parquet(path)]
    else:
        rows = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    logger.warning("%s:%d: skipping malformed JSON line: %s", path, lineno, e.msg)
    yield from rows[sl]


def _maybe_json(value: Any) -> Any:
    """Tools / metadata may be stored as JSON strings (common in Parquet); decode those."""
    return json.loads(value) if isinstance(value, str) else value


def _build_prompt(
    raw: str | list, tokenizer, tools, apply_chat_template: bool, template_kwargs: dict
) -> str | list:
    """The prompt: `raw` itself, or the chat-template text of its messages."""
    if not apply_chat_template:
        return raw
    messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    extra = {"tools": tools} if tools is not None else {}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **extra, **template_kwargs
    )


def _prompt_token_count(prompt: str | list, tokenizer) -> int:
    if not isinstance(prompt, str):  # messages without --apply-chat-template: count their text
        prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def build_samples(
    rows: list[dict],
    *,
    tokenizer=None,
    input_key: str = "input",
    label_key: str | None = None,
    metadata_key: str | None = "metadata",
    tool_key: str | None = "tools",
    apply_chat_template: bool = False,
    apply_chat_template_kwargs: dict | None = None,
    max_prompt_len: int | None = None,
    source: str = "<rows>",
) -> list[Sample]:
    """Turn prompt rows into Samples (docs/slime-compat.md §5).

    prompt = row[input_key] (a string or a list of {"role", "content"} messages); with
    `apply_chat_template` a string becomes one user message and the tokenizer's chat template is
    rendered (tokenize=False, add_generation_prompt=True, tools=row[tool_key] when present, plus
    `apply_chat_template_kwargs`, a dict or its JSON string). label = row[label_key]; metadata = row[metadata_key] or {}.
    Prompts longer than `max_prompt_len` tokens are dropped (the count is logged). `source` names
    the data in error messages. `tokenizer` is needed only for the chat template / length filter.
    """
    template_kwargs = dict(_maybe_json(apply_chat_template_kwargs) or {})
    if (apply_chat_template or max_prompt_len is not None) and tokenizer is None:
        raise ValueError("--apply-chat-template / --rollout-max-prompt-len need a tokenizer")
    samples, dropped = [], 0
    for i, row in enumerate(rows, start=1):
        if row.get(input_key) is None:
            raise KeyError(
                f"{source} row {i}: no --input-key {input_key!r} (missing or null; "
                f"keys: {sorted(row)})"
            )
        tools = _maybe_json(row.get(tool_key)) if tool_key else None
        prompt = _build_prompt(row[input_key], tokenizer, tools, apply_chat_template, template_kwargs)
        if max_prompt_len is not None and _prompt_token_count(prompt, tokenizer) > max_prompt_len:
            dropped += 1
            continue
        metadata = _maybe_json(row.get(metadata_key)) if metadata_key else None
        label = row.get(label_key) if label_key else None
        samples.append(
            Sample(prompt=prompt, label=label, metadata=dict(metadata or {}),
                   apply_chat_template_kwargs=dict(template_kwargs))
        )
    if dropped:
        logger.info(
            "%s: dropped %d of %d prompts longer than --rollout-max-prompt-len %d tokens",
            source, dropped, len(rows), max_prompt_len,
        )
    return samples


def filter_long_prompt(samples: list[Sample], tokenizer, processor, max_length: int | None) -> list[Sample]:
    """slime's helper: the samples whose prompt has at most `max_length` tokens (all when None).
    `processor` is accepted for slime's signature (multimodal prompts are not supported here)."""
    if max_length is None:
        return list(samples)
    return [s for s in samples if _prompt_token_count(s.prompt, tokenizer) <= max_length]


def get_source(sample: Sample) -> str:
    """Where a sample came from: `sample.source`, else metadata["source_name"], else "unknown"."""
    source = getattr(sample, "source", None)
    if source:
        return str(source)
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    return str(metadata.get("source_name") or "unknown")


class Dataset:
    """Prompt Samples in a fixed load order plus the current epoch's visiting order."""

    def __init__(self, samples: list[Sample]):
        """Hold `samples` (not copied); the visiting order starts as the load order."""
        self.samples = samples
        self.order = list(range(len(samples)))

    def shuffle(self, epoch: int, seed: int) -> None:
        """Set the visiting order to the permutation seeded by `seed + epoch`.

        The order depends only on (seed, epoch), not on earlier shuffles, so a resumed run that
        restores the epoch reproduces it.
        """
        order = list(range(len(self.samples)))
        random.Random(seed + epoch).shuffle(order)
        self.order = order

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, position: int) -> Sample:
        """The sample at `position` in the current visiting order."""
        return self.samples[self.order[position]]
