"""slime's `rm_hub.math_dapo_utils` import path: the DAPO score with slime's signature.

`compute_score(solution_str, ground_truth, strict_box_verify=False, pause_tokens_index=None)`
grades the last 300 characters of the response, as slime does, and returns
{"score": +1.0 / -1.0, "acc": bool, "pred": str}. The answer is read as in our `dapo` reward
(`rm_hub.math_dapo`: after the last "Answer:", else the last `\\boxed{}`); with
`strict_box_verify` only a `\\boxed{}` in the last 100 characters counts (from
`pause_tokens_index[-1] - 100` when given). Answers compare with the shared math equivalence,
which accepts more equal spellings than slime's string normaliser (docs/plugins.md).
"""

from __future__ import annotations

from slime.rollout.rm_hub.math_dapo import extract_dapo_answer, score_answer
from slime.rollout.rm_hub.math_utils import extract_boxed_answer, last_boxed_only_string

__all__ = ["compute_score", "verify", "last_boxed_only_string"]


def _strict_box_answer(solution_str: str, pause_tokens_index) -> str:
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must hold 4 positions, got {len(pause_tokens_index)}")
        tail = solution_str[pause_tokens_index[-1] - 100:]
    else:
        tail = solution_str[-100:]
    return extract_boxed_answer(tail) or ""


def verify(solution_str: str, answer, strict_box_verify: bool = False, pause_tokens_index=None) -> tuple[bool, str]:
    """(correct, normalised prediction) of `solution_str` against `answer`."""
    pred = (_strict_box_answer(solution_str, pause_tokens_index) if strict_box_verify
            else extract_dapo_answer(solution_str))
    result = score_answer(pred, answer)
    return result["acc"], result["pred"]


def compute_score(solution_str: str, ground_truth, strict_box_verify: bool = False,
                  pause_tokens_index=None) -> dict:
    """slime's DAPO reward of a whole response (see the module doc)."""
    correct, pred = verify(solution_str[-300:], ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
