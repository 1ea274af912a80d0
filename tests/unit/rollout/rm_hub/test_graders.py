"""The pure graders: deepscaler, dapo, f1 and gpqa."""

import pytest

from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score, grade_f1
from slime.rollout.rm_hub.gpqa import extract_choice, grade_gpqa, label_to_letter
from slime.rollout.rm_hub.math_dapo import compute_score, extract_dapo_answer

THINKING = r"<think>Try \boxed{3}? No: 1/2 + 1/4 = 3/4.</think>"


def test_deepscaler_needs_the_answer_after_think():
    reward = get_deepscaler_rule_based_reward
    assert reward(THINKING + r" The answer is $\boxed{\dfrac{3}{4}}$.", "0.75") == 1.0
    assert reward(r"###Response The total is \boxed{1,000}", "1000") == 1.0
    # The right boxed answer without </think> or ###Response scores nothing.
    assert get_deepscaler_rule_based_reward(r"The answer is \boxed{\frac{3}{4}}", "3/4") == 0.0
    # A boxed answer only inside the thinking does not count.
    assert get_deepscaler_rule_based_reward(THINKING + " so 3/4.", "3") == 0.0
    assert get_deepscaler_rule_based_reward(THINKING + r" \boxed{0.76}", "3/4") == 0.0


def test_dapo_reads_the_last_answer_line():
    response = "Answer: 7 is a guess.\nLet me recheck: 12 * 3 = 36.\nAnswer: 36"
    assert extract_dapo_answer(response) == "36"
    assert compute_score(response, "36") == {"score": 1.0, "acc": True, "pred": "36"}
    assert extract_dapo_answer(r"Answer: $\boxed{\frac{1}{2}}$") == r"\frac{1}{2}"
    assert compute_score(r"Answer: $\boxed{\frac{1}{2}}$", "0.5")["acc"] is True


def test_dapo_wrong_or_missing_answer_scores_minus_one():
    assert compute_score("Answer: 35", "36") == {"score": -1.0, "acc": False, "pred": "35"}
    assert compute_score("I am not sure.", "36") == {"score": -1.0, "acc": False, "pred": ""}


def test_f1_hand_computed():
    # pred tokens: [cat, sat, on, mat] (article dropped); gold: [cat, sat, on, red, mat]
    f1, precision, recall = f1_score("The cat sat on the mat.", "a cat sat on a red mat")
    assert precision == pytest.approx(4 / 4)
    assert recall == pytest.approx(4 / 5)
    assert f1 == pytest.approx(2 * 1.0 * 0.8 / 1.8)
    # Repeated tokens count with multiplicity: pred [paris, paris], gold [paris] -> p=1/2, r=1.
    assert f1_score("Paris Paris", "paris")[0] == pytest.approx(2 / 3)
    assert f1_score("London", "Paris") == (0.0, 0.0, 0.0)
    assert grade_f1("Paris", ["London", "Paris!"]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "response,letter",
    [
        ("Answer: C", "C"),
        ("Thinking... so the answer is (B).", "B"),
        (r"Therefore $\boxed{D}$", "D"),
        (r"\boxed{\text{(A)}}", "A"),
        ("I ruled out (A) and (D). Answer: **B**", "B"),
        ("<think>Answer: A</think> Final answer: C", "C"),
        ("C", "C"),
        ("answer: a", None),
        ("Answer: (c)", "C"),
        ("No idea.", None),
    ],
)
def test_gpqa_letter_extraction(response, letter):
    assert extract_choice(response) == letter


def test_gpqa_choices_from_metadata():
    meta = {"choices": ["Oslo", "Paris", "Rome", "Bern", "Madrid"]}
    assert label_to_letter("Paris", meta) == "B"
    assert label_to_letter("(E)", meta) == "E"
    assert grade_gpqa("Answer: E", "Madrid", meta) == 1.0
    assert grade_gpqa("Answer: E", "Paris", meta) == 0.0
    assert grade_gpqa("Answer: E", "D", None) == 0.0
    assert grade_gpqa("Answer: E", "E", None) == 1.0  # A-J without metadata choices, as slime
    with pytest.raises(ValueError, match="ABC"):
        grade_gpqa("Answer: E", "E", {"valid_letters": ["A", "B", "C"]})
    assert grade_gpqa("The answer is (b)", "B", None) == 1.0
    with pytest.raises(ValueError, match="neither an option letter"):
        label_to_letter("Lisbon", meta)


def test_gpqa_slime_metadata_and_index_labels():
    from slime.rollout.rm_hub.gpqa import DEFAULT_VALID_LETTERS, compute_gpqa_reward

    assert DEFAULT_VALID_LETTERS == "ABCDEFGHIJ"
    assert compute_gpqa_reward("Answer: C", 2) == 1.0 and compute_gpqa_reward("Answer: C", "2") == 1.0
    assert compute_gpqa_reward("Answer: B", "ignored", {"correct_letter": "B"}) == 1.0
    meta = {"choices": ["x", "y", "z"], "correct_answer": "z"}
    assert compute_gpqa_reward("the answer is (C)", "unused", meta) == 1.0
