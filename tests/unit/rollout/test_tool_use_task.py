"""examples/tool_use/calculator_task.py: one-token turns, the first turn and a later non-digit one
call the calculator on the question, the tool's answer is masked out of the loss, a digit is the answer and the reward its
exact match; against a scripted engine (tests/unit/rollout/test_tool_use_example.py's)."""

import asyncio

import pytest

from examples.tool_use import calculator_task as task
from slime.rollout.generate_state import GenerateState
from slime.utils.types import Sample
from tests.unit.rollout.test_tool_use_example import ScriptedEngine, bare_args  # noqa: F401 fixture

LENGTH = {"type": "length", "length": 1}


def run(monkeypatch, args, turns, generate=task.generate, budget=5):
    tokenizer = GenerateState(args).tokenizer
    engine = ScriptedEngine(tokenizer, [(t, LENGTH) for t in turns])
    monkeypatch.setattr(task, "post", engine.post)
    sample = Sample(prompt="<|im_start|>user\n347%3<|im_end|>\n<|im_start|>assistant\n", label="2", index=0,
                    metadata={"question": "347%3"})
    out = asyncio.run(generate(args, sample, {"max_new_tokens": budget, "temperature": 1.0}))
    return out, engine, lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_call_appends_the_calculators_answer_masked(bare_args, monkeypatch):  # noqa: F811
    out, engine, ids = run(monkeypatch, bare_args, ["=", "2"])
    prompt = ids(out.prompt)
    assert out.tokens == prompt + ids("=") + ids("2") + ids("2")
    assert out.response_length == 3 == len(out.tokens) - len(prompt)
    assert out.loss_mask == [1, 0, 1]
    assert out.rollout_log_probs == [-0.5, 0.0, -0.5]
    assert [r["sampling_params"]["max_new_tokens"] for r in engine.requests] == [1, 1]
    assert engine.requests[1]["input_ids"] == prompt + ids("=2")  # the model saw the tool's answer
    assert out.metadata["tool_calls"] == 1 and out.metadata["answer"] == "2"
    assert out.status == Sample.Status.COMPLETED
    assert asyncio.run(task.reward(bare_args, out)) == 1.0


def test_several_calls_then_the_last_turn_is_the_answer(bare_args, monkeypatch):  # noqa: F811
    out, engine, ids = run(monkeypatch, bare_args, ["?", "a", "="])
    assert out.tokens[-5:] == ids("?2a2=")
    assert out.loss_mask == [1, 0, 1, 0, 1] and len(engine.requests) == task.MAX_CALLS + 1
    assert out.metadata["tool_calls"] == task.MAX_CALLS and out.metadata["answer"] == "="
    assert asyncio.run(task.reward(bare_args, out)) == 0.0  # the last turn is the answer, not a call


def test_the_first_turn_is_always_a_call(bare_args, monkeypatch):  # noqa: F811
    out, engine, ids = run(monkeypatch, bare_args, ["1", "0"])
    assert out.tokens[-3:] == ids("120") and out.loss_mask == [1, 0, 1] and len(engine.requests) == 2
    assert out.metadata["tool_calls"] == 1 and out.metadata["answer"] == "0"
    assert asyncio.run(task.reward(bare_args, out)) == 0.0 and out.status == Sample.Status.COMPLETED


def test_only_a_digit_is_an_answer():
    assert not task.is_call("0") and not task.is_call("7")
    assert task.is_call("=") and task.is_call("a") and task.is_call("<|im_end|>") and task.is_call("12")


def test_the_baseline_tool_answers_nothing(bare_args, monkeypatch):  # noqa: F811
    out, _, ids = run(monkeypatch, bare_args, ["=", "2"], generate=task.generate_without_tool)
    assert out.tokens[-3:] == ids("=?2") and out.loss_mask == [1, 0, 1]
    assert asyncio.run(task.reward(bare_args, out)) == 1.0


def test_the_budget_covers_tool_tokens(bare_args, monkeypatch):  # noqa: F811
    out, engine, _ = run(monkeypatch, bare_args, ["=", "?"], budget=3)  # a second call, no room for its answer
    assert out.response_length == 3 and out.loss_mask == [1, 0, 1] and len(engine.requests) == 2
    out, engine, _ = run(monkeypatch, bare_args, ["="], budget=2)  # no room for an answer
    assert out.response_length == 2 and out.loss_mask == [1, 0] and len(engine.requests) == 1
    assert out.status == Sample.Status.TRUNCATED and out.metadata["answer"] is None
    assert asyncio.run(task.reward(bare_args, out)) == 0.0


def test_a_sample_without_a_question_is_refused(bare_args, monkeypatch):  # noqa: F811
    monkeypatch.setattr(task, "post", None)
    with pytest.raises(ValueError, match="metadata\\['question'\\].*--task mod3"):
        asyncio.run(task.generate(bare_args, Sample(prompt="1%3", index=0), {"max_new_tokens": 9}))
