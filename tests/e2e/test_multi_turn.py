"""End to end with multi-turn rollouts: a custom generate function written as slime users write
them (tests/unit/rollout/slime_style_generate.py: two model turns with a tool's output between
them, appended with `append_response_tokens(..., trainable=False)`) drives `train.py`.

Checks what only the whole loop shows: the tool tokens reach the trainer with loss mask 0 (and
the model turns with 1), every trajectory is prompt + response tokens, and the trainer's
log-probs of the model turns, recomputed over the packed multi-turn sequences, equal the engine's.
The tool-use example's task (examples/tool_use/calculator_task.py) runs the same checks through
`train.py` and `train_async.py` (rollouts for step n+1 generated while step n trains).
"""

from pathlib import Path

import pytest
import torch

from tests.e2e.runner import grpo_argv, rollout_rows, run_train

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NUM_ROLLOUT = 2
TURN_LEN = 2  # --rollout-max-response-len: new tokens per model turn


def record_train_data(args, rollout_id, rollout_data):
    """--rollout-data-postprocess-path hook: keep what the trainer is given, for the assertions."""
    keep = ("tokens", "response_lengths", "loss_masks")
    torch.save({k: rollout_data[k] for k in keep}, Path(args.save).parent / f"train_data_{rollout_id}.pt")


def test_multi_turn_tool_rollouts_train(e2e_inputs, tmp_path):
    dump = tmp_path / "rollout_{rollout_id}.pt"
    extra = ["--custom-generate-function-path", "tests.unit.rollout.slime_style_generate.generate",
             "--custom-rm-path", "tests.unit.rollout.slime_style_generate.reward",
             "--rollout-max-response-len", str(TURN_LEN),
             "--save-debug-rollout-data", str(dump), "--save-interval", "100",
             "--rollout-data-postprocess-path", "tests.e2e.test_multi_turn.record_train_data"]
    argv = grpo_argv(e2e_inputs.hf, e2e_inputs.torch_dist, e2e_inputs.data, tmp_path, NUM_ROLLOUT, extra=extra)
    by_id = rollout_rows(run_train(argv, tmp_path, timeout=600))
    assert sorted(by_id) == list(range(NUM_ROLLOUT))
    for rollout_id in range(NUM_ROLLOUT):
        # the model turns' log-probs, recomputed by the trainer with the tool tokens in context
        assert by_id[rollout_id]["train/train_rollout_logprob_abs_diff"] < 1e-3, by_id[rollout_id]
        samples = torch.load(str(dump).format(rollout_id=rollout_id), weights_only=False)["samples"]
        train = torch.load(tmp_path / f"train_data_{rollout_id}.pt", weights_only=False)
        masks = sorted(tuple(int(x) for x in m) for m in train["loss_masks"])
        assert masks == sorted(tuple(s["loss_mask"]) for s in samples)
        for s in samples:
            n, mask = s["response_length"], s["loss_mask"]
            assert len(mask) == len(s["rollout_log_probs"]) == n
            first = mask.index(0)
            tool = mask[first:].index(1) if 1 in mask[first:] else n - first
            assert 1 <= first <= TURN_LEN and tool > 10  # model turn, the tool's output (masked), model turn
            assert mask == [1] * first + [0] * tool + [1] * (n - first - tool)
            assert 1 <= n - first - tool <= TURN_LEN
            assert s["rollout_log_probs"][first:first + tool] == [0.0] * tool
            assert s["reward"] in (1.0, -1.0)
        prompt_lens = sorted(len(t) - n for t, n in zip(train["tokens"], train["response_lengths"]))
        assert prompt_lens == sorted(len(s["tokens"]) - s["response_length"] for s in samples)
        assert min(prompt_lens) > 0


# ---- examples/tool_use/calculator_task.py through train.py and train_async.py ----

EXAMPLE_BUDGET = 5  # two calls (a token and the tool's digit, twice) and the answer, as the launch script


async def generate_always_calling(args, sample, sampling_params):
    """The example's turns, every model turn but the last taken as a call (an untrained model
    writes a digit on ~8% of its turns), so each trajectory holds two masked tool answers."""
    from examples.tool_use import calculator_task

    return await calculator_task.run_turns(args, sample, sampling_params, calculator_task.calculator_tool,
                                           call=lambda text: True)


@pytest.fixture(scope="module")
def mod3_data(tmp_path_factory) -> Path:
    from tests.conftest import load_tool

    out = tmp_path_factory.mktemp("mod3_data")
    return load_tool("make_toy_data").make_toy_data(out, seed=0, num_train=64, task="mod3")


@pytest.mark.parametrize("entry", ["train.py", "train_async.py"])
def test_tool_use_example_trains(entry, e2e_inputs, mod3_data, tmp_path):
    """The example's multi-turn rollouts through the whole loop, synchronous and one step off:
    the calculator's answers reach the trainer with loss mask 0 and log-prob 0, every trajectory
    is the tokenized prompt followed by its response, and the trainer's log-probs of the model's
    turns equal the engine's (rollout 0 in the async run; later ones are one step behind)."""
    from transformers import AutoTokenizer

    from examples.tool_use import calculator_task

    dump = tmp_path / "rollout_{rollout_id}.pt"
    extra = ["--custom-generate-function-path", "tests.e2e.test_multi_turn.generate_always_calling",
             "--custom-rm-path", "examples.tool_use.calculator_task.reward", "--metadata-key", "metadata",
             "--rollout-max-response-len", str(EXAMPLE_BUDGET),
             "--save-debug-rollout-data", str(dump), "--save-interval", "100",
             "--rollout-data-postprocess-path", "tests.e2e.test_multi_turn.record_train_data"]
    argv = grpo_argv(e2e_inputs.hf, e2e_inputs.torch_dist, mod3_data, tmp_path, NUM_ROLLOUT, extra=extra)
    by_id = rollout_rows(run_train(argv, tmp_path, entry=entry, timeout=600))
    assert sorted(by_id) == list(range(NUM_ROLLOUT))
    assert by_id[0]["train/train_rollout_logprob_abs_diff"] < 1e-3, by_id[0]
    if entry == "train_async.py":  # rollout 1 was generated while step 0 trained: the old weights
        assert by_id[1]["train/train_rollout_logprob_abs_diff"] > 1e-3, by_id[1]
    tokenizer = AutoTokenizer.from_pretrained(e2e_inputs.hf)
    for rollout_id in range(NUM_ROLLOUT):
        samples = torch.load(str(dump).format(rollout_id=rollout_id), weights_only=False)["samples"]
        train = torch.load(tmp_path / f"train_data_{rollout_id}.pt", weights_only=False)
        assert sorted(tuple(int(x) for x in m) for m in train["loss_masks"]) == sorted(
            tuple(s["loss_mask"]) for s in samples)
        for s in samples:
            prompt = tokenizer(s["prompt"], add_special_tokens=False)["input_ids"]
            assert s["tokens"][:len(prompt)] == prompt and len(s["tokens"]) == len(prompt) + s["response_length"]
            assert s["loss_mask"] == [1, 0, 1, 0, 1]
            assert [lp for lp, m in zip(s["rollout_log_probs"], s["loss_mask"]) if m == 0] == [0.0] * 2
            answer = calculator_task.calculator(s["metadata"]["question"])
            response = s["tokens"][len(prompt):]
            assert tokenizer.decode(response[1]) == tokenizer.decode(response[3]) == answer == s["label"]
            assert s["metadata"]["tool_calls"] == 2
            assert s["reward"] == float(s["metadata"]["answer"] == s["label"])
        assert sorted(len(t) for t in train["tokens"]) == sorted(len(s["tokens"]) for s in samples)
