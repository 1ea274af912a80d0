"""The pre-flight checks one by one, on a Namespace (the entry-level behaviour is in
tests/unit/test_preflight_entry.py)."""

import json
from argparse import Namespace
from collections import namedtuple

import pytest

from slime.utils.plugin_signatures import PLUGIN_FLAGS
from slime.utils.preflight import CHECKS, Report, run_preflight
from slime.utils.preflight import storage
from slime.utils.preflight.data import check_data_file
from slime.utils.preflight.plugins import CALLS
from slime.utils.preflight.ranges import RANGES
from slime.utils.arguments import build_parser


def test_every_plugin_flag_has_a_call_shape():
    assert set(CALLS) == set(PLUGIN_FLAGS)


def test_every_range_names_a_flag_of_the_parser():
    dests = {a.dest for a in build_parser()._actions}
    assert set(RANGES) <= dests


def test_large_file_is_streamed_and_first_bad_line_named(tmp_path):
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for i in range(20000):
            f.write(json.dumps({"input": f"p{i}"}) + "\n")
        f.write("{broken\n")
    report = Report()
    check_data_file(report, "--prompt-data", str(path), {"--input-key": "input"})
    assert [e.line() for e in report.errors][0].startswith(f"--prompt-data {path}:20001: not valid JSON")


def test_slice_that_keeps_no_rows(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"input": "a"}\n')
    report = Report()
    check_data_file(report, "--prompt-data", f"{path}@[5:]", {"--input-key": "input"})
    assert "the slice keeps none" in report.errors[0].line()


def test_parquet_columns_checked_from_the_schema(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"question": ["a", "b"]}), path)
    report = Report()
    check_data_file(report, "--prompt-data", str(path), {"--input-key": "prompt"})
    assert "no column 'prompt'" in report.errors[0].line()


def test_save_without_room_for_one_checkpoint(tmp_path, monkeypatch):
    args = Namespace(metrics_dir=str(tmp_path / "run"), save=str(tmp_path / "ckpt"), no_save_optim=False)
    monkeypatch.setattr(storage, "checkpoint_bytes", lambda args: 10 * 2**30)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: Usage(2**40, 2**40 - 2**30, 2**30))
    report = Report()
    storage.check_storage(args, report)
    assert [e.flag for e in report.errors] == ["--save"]
    assert "1.0 GiB free, one checkpoint needs about 10.0 GiB" in report.errors[0].line()


def test_checkpoint_estimate_from_the_plan(tiny_moe_hf):
    from tests.e2e.runner import MODEL_ARGS

    parser = build_parser()
    args = parser.parse_args([*MODEL_ARGS, "--rollout-batch-size", "1", "--num-rollout", "1"])
    full = storage.checkpoint_bytes(args)
    args.no_save_optim = True
    assert full and storage.checkpoint_bytes(args) < full


def test_dry_run_report_only_warns_on_missing_paths(tmp_path):
    args = Namespace(dry_run=True, prompt_data=str(tmp_path / "nowhere.jsonl"), input_key="input", label_key=None,
                     metadata_key="metadata", eval_datasets=[], apply_chat_template=True,
                     hf_checkpoint=str(tmp_path / "hf"), metrics_dir=str(tmp_path / "run"), save=None, load=None)
    report = run_preflight(args, {k: CHECKS[k] for k in ("prompt_data", "chat_template", "storage", "run_folder")})
    assert not report.errors and not report.warnings  # the argument validation warned already


@pytest.mark.parametrize("dry_run", [True, False])
def test_hf_folder_without_tokenizer_files(tmp_path, dry_run):
    """A recipe's --hf-checkpoint holding only config.json (dry-run away from its cluster): a warning
    under --dry-run, an error before a real start."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    args = Namespace(dry_run=dry_run, apply_chat_template=True, eval_datasets=[], hf_checkpoint=str(tmp_path / "hf"))
    report = run_preflight(args, {"chat_template": CHECKS["chat_template"]})
    found = report.warnings if dry_run else report.errors
    assert [f.flag for f in found] == ["--hf-checkpoint"] and "no tokenizer files" in found[0].line()
