"""The CPU twin of the seed GPU recipe, scripts/run-qwen3-30B-A3B.sh (DESIGN.md §2b rule 4): its
own flags, verbatim but for the model (the tiny Qwen3-MoE reshaped for TP4 / EP8), the paths, the
device (8 gloo ranks: TP4 + SP, EP8, DP2, colocated) and the listed run-size overrides, through
CPU Adam with the precision-aware distributed optimizer, full recompute and dynamic batches, for
two rollouts with weight syncs and a save, then a resume from --load for a third.

One twin run (tools/recipe_twin.py, the code `tools/recipe_twin.sh` runs) serves the checks.
"""

import json

import pytest

from tests.conftest import load_tool
from tests.e2e.runner import REPO_ROOT
from tests.warm_python import warm_python

pytestmark = pytest.mark.e2e

SEED_RECIPE = "qwen3-30B-A3B"


@pytest.fixture(scope="module")
def seed_twin(tmp_path_factory):
    """(module, Twin) of the seed recipe's twin, run to the end (RuntimeError names the first error)."""
    tool = load_tool("recipe_twin")
    return tool, tool.run_twin(SEED_RECIPE, tmp_path_factory.mktemp("twins"), max_ranks=8, timeout=1200,
                               prep_python=warm_python())


def test_seed_twin_keeps_the_recipe_layout(seed_twin):
    tool, twin = seed_twin
    assert twin.layout == tool.Layout(nodes=1, gpus_per_node=8, tp=4, pp=1, cp=1, ep=8, etp=1)
    argv = twin.argv
    for flag in ("--sequence-parallel", "--colocate", "--use-dynamic-batch-size", "--optimizer-cpu-offload",
                 "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer", "--bf16", "--balance-data"):
        assert flag in argv, flag
    assert tool.flag_value(argv, "--recompute-granularity") == "full"
    assert tool.flag_value(argv, "--max-tokens-per-gpu") == "8192"
    # only the model, paths, device and the documented run sizes differ from the recipe's flags
    changed = {line.split()[0] for line in twin.changes}
    assert changed == {"--rollout-batch-size", "--global-batch-size", "--rollout-max-response-len",
                       "--eval-max-response-len", "--metrics-dir"}, twin.changes


def test_seed_twin_trains_syncs_saves_and_resumes(seed_twin):
    tool, twin = seed_twin
    metrics = twin.folder / "model_dir" / "metrics" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train_rows = {r["rollout_id"]: r for r in rows if "rollout/raw_reward" in r}
    assert sorted(train_rows) == [0, 1, 2]
    for rollout_id, row in train_rows.items():
        assert row["train/grad_norm"] > 0, (rollout_id, row)
        # the engine generated with the trainer's synced weights
        assert row["train/train_rollout_logprob_abs_diff"] < 1e-2, (rollout_id, row)
    save = tool.flag_value(twin.argv, "--save")
    assert (REPO_ROOT / save / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
