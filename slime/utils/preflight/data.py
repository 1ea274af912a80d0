"""Prompt and eval files: each exists, parses, has rows, and every row carries the keys the flags
name. Files are streamed (one line, or one Parquet column chunk, at a time), never loaded whole.

The first bad line is reported with its 1-based number; the check stops there.
"""

from __future__ import annotations

import json
from pathlib import Path

from slime.utils.data import parse_data_path
from slime.utils.preflight.report import Report

SUFFIXES = (".jsonl", ".parquet")
INPUT_FLAG = "--input-key"  # the prompt: a null counts as missing (a null label is a label)


def _jsonl_problem(path: str, keys: dict[str, str], metadata: tuple[str, str] | None):
    """(rows, None) or (rows so far, "LINE: what is wrong") for the JSONL file at `path`."""
    rows = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                return rows, f"{path}:{lineno}: not valid JSON ({getattr(e, 'msg', e)})"
            if not isinstance(row, dict):
                return rows, f"{path}:{lineno}: a row must be a JSON object, got {type(row).__name__}"
            for flag, key in keys.items():
                if key not in row or (row[key] is None and flag == INPUT_FLAG):
                    return rows, f"{path}:{lineno}: row has no {key!r} field (named by {flag}; its keys: {sorted(row)[:10]})"
            if metadata is not None and not _is_mapping(row.get(metadata[1])):
                return rows, f"{path}:{lineno}: {metadata[1]!r} (named by {metadata[0]}) must be an object or its JSON string"
            rows += 1
    return rows, None


def _is_mapping(value) -> bool:
    if value is None or isinstance(value, dict):
        return True
    if isinstance(value, str):
        try:
            return isinstance(json.loads(value), dict)
        except json.JSONDecodeError:
            return False
    return False


def _parquet_problem(path: str, keys: dict[str, str], metadata):
    """(rows, None) or (rows, "what is wrong") from the Parquet file's schema and footer."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises its own error types for a file that is not Parquet
        return 0, f"{path}: not a readable Parquet file ({type(e).__name__}: {e})"
    columns = set(meta.schema_arrow.names)
    for flag, key in keys.items():
        if key not in columns:
            return 0, f"{path}: no column {key!r} (named by {flag}; columns: {sorted(columns)[:10]})"
    return meta.metadata.num_rows, None


def check_data_file(report: Report, flag: str, path_with_slice: str, keys: dict[str, str],
                    metadata: tuple[str, str] | None = None) -> None:
    """Report on one prompt file: exists, type, parse, rows carrying `keys` ({flag: key}), non-empty
    (after its `@[a:b]` slice)."""
    path, sl = parse_data_path(path_with_slice)
    if not report.missing(flag, path):
        return
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        report.error(flag, f"{path}: unsupported file type {suffix!r}", f"use one of {', '.join(SUFFIXES)}")
        return
    reader = _jsonl_problem if suffix == ".jsonl" else _parquet_problem
    rows, problem = reader(path, keys, metadata)
    if problem:
        report.error(flag, problem, "fix the file or the key flag")
    elif not range(rows)[sl]:
        report.error(flag, f"{path_with_slice}: no rows" + (f" (the file has {rows}, the slice keeps none)" if rows else ""),
                     "give a file with at least one prompt")


def check_prompt_data(args, report: Report) -> None:
    """`--prompt-data` with `--input-key`, `--label-key` and `--metadata-key`."""
    if not getattr(args, "prompt_data", None):
        return
    keys = {"--input-key": args.input_key}
    if getattr(args, "label_key", None):
        keys["--label-key"] = args.label_key
    meta_key = getattr(args, "metadata_key", None)
    check_data_file(report, "--prompt-data", args.prompt_data, keys, ("--metadata-key", meta_key) if meta_key else None)


def check_eval_data(args, report: Report) -> None:
    """Every eval dataset (`--eval-prompt-data` / `--eval-config`) with its resolved keys."""
    for d in getattr(args, "eval_datasets", None) or []:
        flag = f"--eval-prompt-data {d.name}"
        keys = {INPUT_FLAG: d.input_key or "input"}
        if d.label_key:
            keys["--label-key"] = d.label_key
        check_data_file(report, flag, str(d.path), keys, ("--metadata-key", d.metadata_key) if d.metadata_key else None)
