"""Smoke test of tools/bench_train_step.py: one step per backend, table printed, JSON written."""

import json
import os
import subprocess

from tests.conftest import REPO_ROOT, load_tool
from tests.warm_python import warm_python

bench = load_tool("bench_train_step")


def test_fixed_batch_shape():
    batch = bench.fixed_batch(vocab=50, batch=4, seq_len=10)
    assert [len(t) for t in batch["tokens"]] == [10] * 4
    assert max(max(t) for t in batch["tokens"]) < 50
    assert batch["response_lengths"] == [5] * 4 and batch["loss_masks"] == [[1] * 5] * 4
    assert batch == bench.fixed_batch(vocab=50, batch=4, seq_len=10)


def test_summarize_ratio():
    batch = bench.fixed_batch(vocab=50, batch=2, seq_len=10)
    got = bench.summarize(batch, megatron=[2.0, 4.0, 3.0], hf=[1.0])
    assert got["tokens_per_step"] == 20
    assert got["backends"]["megatron"]["tokens_per_s"] == 20 / 3.0
    assert got["ratio_megatron_over_transformers"] == (20 / 3.0) / 20.0


def test_one_iteration_run(tiny_moe_hf, tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [warm_python(), str(REPO_ROOT / "tools" / "bench_train_step.py"), "--hf-dir", str(tiny_moe_hf),
         "--iterations", "1", "--warmup", "0", "--batch", "2", "--seq-len", "16", "--output", str(out)],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["backends"]) == {"megatron", "transformers"}
    assert result["tokens_per_step"] == 32 and result["ratio_megatron_over_transformers"] > 0
    assert "ratio megatron/transformers" in proc.stdout
