"""tools/recipe_twin.py without running a twin: every GPU recipe hands its flags over in twin mode
(the same argv its --dry-run gets), the twin changes only the model, paths, device and the listed
run sizes, the CPU layout keeps the recipe's sizes where they fit, the tiny shapes divide by the
layout, and make_tiny_model writes the reshaped checkpoint."""

import json
from pathlib import Path

import pytest

from tests.conftest import load_tool

REPO_ROOT = Path(__file__).resolve().parents[3]
RECIPES = sorted(p.stem[len("run-"):] for p in (REPO_ROOT / "scripts").glob("run-*.sh") if p.stem != "run-tiny-moe-cpu")


@pytest.fixture(scope="module")
def tool():
    return load_tool("recipe_twin")


@pytest.fixture(scope="module")
def recipes(tool, tmp_path_factory):
    out = tmp_path_factory.mktemp("twin_capture")
    return {name: tool.capture(name, out / name, tool.twin_env()) for name in RECIPES}


def test_every_gpu_recipe_is_covered():
    assert "qwen3-30B-A3B" in RECIPES and len(RECIPES) == 8, RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_hands_over_its_flags(recipes, tool, name):
    recipe = recipes[name]
    assert recipe.entry == "train.py"
    assert tool.swap_model(recipe.argv, recipe.model_args, ["MODEL"]).count("MODEL") == 1
    assert "twin_capture" in tool.flag_value(recipe.argv, "--hf-checkpoint")


# the tiny variant each recipe's MODEL_ARGS run on (TinyVariant.recipe_match of slime.models)
TINY_OF = {"qwen3-30B-A3B": "moe", "qwen3-4B": "dense", "qwen3-0.6B": "dense", "deepseek-v3": "deepseek_v3",
           "kimi-k2": "deepseek_v3", "moonlight-16B-A3B": "deepseek_v3", "glm4.5-355B-A32B": "glm4_moe",
           "glm4.5-106B-A12B": "glm4_moe"}


@pytest.mark.parametrize("name", RECIPES)
def test_each_recipe_runs_on_its_familys_tiny_variant(recipes, tool, name):
    assert tool.family_of(recipes[name].model_args)[0] == TINY_OF[name]


@pytest.mark.parametrize("name", RECIPES)
def test_twin_changes_only_model_paths_device_and_run_sizes(recipes, tool, name, tmp_path):
    recipe = recipes[name]
    twin = tool.build_twin(recipe, tmp_path, max_ranks=8)
    allowed = {"--rollout-batch-size", "--global-batch-size", "--rollout-max-response-len",
               "--eval-max-response-len", "--metrics-dir", "--actor-num-nodes", "--actor-num-gpus-per-node",
               "--rollout-num-gpus-per-engine", "--rollout-num-gpus", "--decoder-last-pipeline-num-layers",
               *tool.ENGINE_SIZE_FLAGS, *tool.LAYOUT_FLAGS.values()}
    rest = tool.swap_model(twin.argv, twin.model_args, [])
    original = tool.swap_model(recipe.argv, recipe.model_args, [])
    for flag in allowed:
        rest, original = tool.set_flag(rest, flag, None), tool.set_flag(original, flag, None)
    assert rest == original
    assert twin.layout.world <= 8
    for key, flag in tool.LAYOUT_FLAGS.items():
        assert tool.flag_value(twin.argv, flag, "1") == str(getattr(twin.layout, key))
    named = {line.split()[0] for line in twin.changes}
    for key in tool.LAYOUT_FLAGS:
        if getattr(twin.layout, key) != getattr(tool.recipe_layout(recipe.argv), key):
            assert key.upper() in named, twin.changes


def test_seed_layout_is_kept(tool):
    gpu = tool.Layout(nodes=1, gpus_per_node=8, tp=4, ep=8)
    assert tool.fit_layout(gpu, 8) == (gpu, [])


def test_data_parallel_replicas_and_nodes_go_first(tool):
    gpu = tool.Layout(nodes=2, gpus_per_node=8, tp=2, pp=2, ep=8)  # DP 4
    layout, changes = tool.fit_layout(gpu, 8)
    assert (layout.nodes, layout.world, layout.tp, layout.pp, layout.dp, layout.ep) == (1, 8, 2, 2, 2, 4)
    assert changes == ["EP 8 -> 4"]


def test_model_parallel_beyond_the_machine_is_halved_and_reported(tool):
    gpu = tool.Layout(nodes=16, gpus_per_node=8, tp=8, pp=4, cp=4, ep=32)
    layout, changes = tool.fit_layout(gpu, 8)
    assert (layout.world, layout.tp, layout.pp, layout.cp, layout.ep) == (8, 4, 2, 1, 4)
    assert changes[:3] == ["TP 8 -> 4", "PP 4 -> 2", "CP 4 -> 1" + tool.CP_REASON]


@pytest.mark.parametrize("family", ["moe", "dense", "deepseek_v3", "glm4_moe"])
def test_tiny_shape_divides_by_the_layout(tool, family):
    layout = tool.Layout(nodes=1, gpus_per_node=8, tp=4, pp=2, ep=4)
    shape = tool.tiny_shape(family, layout, last_stage_layers=3)
    assert shape["num_attention_heads"] % 4 == 0 and shape["num_key_value_heads"] % 4 == 0
    first_stage = 2 if family in ("deepseek_v3", "glm4_moe") else 1  # a dense first layer and an MoE one
    assert shape["vocab_size"] % (128 * 4) == 0 and shape["num_hidden_layers"] == first_stage + 3
    experts = shape.get("num_experts") or shape.get("n_routed_experts")
    assert family == "dense" or experts % 4 == 0


def test_make_tiny_model_writes_the_override(tmp_path):
    make = load_tool("make_tiny_model")
    out = make.make_tiny_model(tmp_path / "hf", variant="moe",
                               overrides=make.parse_overrides(["num_key_value_heads=4", "num_hidden_layers=3"]))
    config = json.loads((out / "config.json").read_text())
    assert (config["num_key_value_heads"], config["num_hidden_layers"]) == (4, 3)
    with pytest.raises(ValueError, match="--config"):
        make.model_config("moe", {"num_kv_heads": 4})


def test_train_data_asks_for_the_random_reward(tool, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"prompt": "p", "label": "1"}) + "\n")
    tool.write_train_data(source, tmp_path / "out" / "train.jsonl", "metadata")
    row = json.loads((tmp_path / "out" / "train.jsonl").read_text())
    assert row == {"prompt": "p", "label": "1", "metadata": {"rm_type": tool.DATA_REWARD}}


def test_first_error_is_the_traceback_line(tool, tmp_path):
    log = tmp_path / "log"
    log.write_text("start\nTraceback (most recent call last):\n  File x\nKeyError: 'w'\nmore\n")
    assert tool.first_error(log) == "KeyError: 'w'"
