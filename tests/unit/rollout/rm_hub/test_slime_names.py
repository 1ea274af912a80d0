"""slime's rm_hub names and scores: math_utils.grade_answer_verl & co, package re-exports, int scores."""

import asyncio
from types import SimpleNamespace

from slime.rollout import rm_hub
from slime.rollout.rm_hub import math_utils
from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score, normalize_answer
from slime.utils.types import Sample


def test_grade_answer_verl_needs_a_boxed_answer():
    assert math_utils.grade_answer_verl("so \\boxed{\\frac{1}{2}}", "0.5") is True
    assert math_utils.grade_answer_verl("the answer is 0.5", "0.5") is False
    assert math_utils.grade_answer_verl("\\boxed{3}", "\\boxed{3}") is True
    assert math_utils.grade_answer_verl("\\boxed{3}", "") is False
    assert math_utils.extract_answer("a \\boxed{x+1} b") == "x+1" and math_utils.extract_answer("none") is None
    assert math_utils.remove_boxed("\\boxed{7}") == "7" and math_utils.remove_boxed("7") is None
    assert math_utils.grade_answer_mathd("10", "10") and not math_utils.grade_answer_mathd("1/2", "0.5")
    assert math_utils.grade_answer_sympy("\\frac{1}{2}", "0.5")


def test_math_and_deepscaler_rewards_are_ints():
    args = SimpleNamespace(rm_type="math", custom_rm_path=None)
    boxed = Sample(response="\\boxed{4}", label="4")
    assert asyncio.run(rm_hub.async_rm(args, boxed)) == 1 and type(asyncio.run(rm_hub.async_rm(args, boxed))) is int
    wrong = Sample(response="\\boxed{5}", label="4")
    assert type(asyncio.run(rm_hub.async_rm(args, wrong))) is int
    assert get_deepscaler_rule_based_reward("</think> \\boxed{4}", "4") == 1
    assert type(get_deepscaler_rule_based_reward("no marker", "4")) is int


def test_f1_slime_rules():
    assert normalize_answer("The  Cat!") == "cat"
    assert f1_score(None, "x") == (0.0, 0.0, 0.0)
    assert f1_score("yes it is", "yes") == (0.0, 0.0, 0.0)
    assert f1_score("yes", "yes")[0] == 1.0


def test_package_reexports():
    assert rm_hub.grade_answer_verl is math_utils.grade_answer_verl
    assert rm_hub.extract_boxed_answer("\\boxed{2}") == "2"
    assert callable(rm_hub.remote_rm) and callable(rm_hub.compute_score_dapo) and callable(rm_hub.f1_score)
