"""Registry of built-in reward types (`--rm-type`, `metadata["rm_type"]`) and the `boxed_` prefix.

Owns `REWARD_TYPES` (name -> grader) and `get_reward_fn`. A grader is
`async grader(args, sample, text, *, answer_only, **kwargs)`. Normally `text` is the whole
response and `answer_only` is False. For `boxed_<type>`, `text` is only the content of the
response's last `\\boxed{}` ("" when there is none, which scores as a wrong answer) and
`answer_only` is True: the grader compares that answer to the label directly instead of looking
for an answer in it (so `boxed_deepscaler` does not need `</think>`, `boxed_dapo` no "Answer:").
CPU-bound graders run in a worker thread so sympy does not block the rollout's event loop. Only
`remote_rm` takes keyword options (`max_attempts`, `base_delay`, `timeout`); passing any to a
local type is a TypeError.
"""

from __future__ import annotations

import asyncio
import random
from types import MappingProxyType
from typing import Any, Awaitable, Callable

from slime.rollout.rm_hub.char_match import char_match_score
from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import grade_f1
from slime.rollout.rm_hub.gpqa import grade_gpqa
from slime.rollout.rm_hub.math_dapo import compute_score, score_answer
from slime.rollout.rm_hub.math_utils import extract_boxed_answer, grade_answer, grade_math
from slime.rollout.rm_hub.remote_rm import remote_rm

BOXED_PREFIX = "boxed_"


class UnknownRewardTypeError(ValueError, NotImplementedError):
    """A missing or unknown reward type. slime raises NotImplementedError; this is both, so code
    catching either keeps working."""
Grader = Callable[..., Awaitable[Any]]
LocalFn = Callable[[str, Any, dict], Any]


def _local(name: str, score_response: LocalFn, score_answer_only: LocalFn) -> Grader:
    """Wrap pure `fn(text, label, metadata)` scorers as an async grader run in a worker thread;
    `grader.score(sample, text, answer_only)` is the same score computed in the calling thread."""

    def score(sample, text: str, answer_only: bool):
        metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
        return (score_answer_only if answer_only else score_response)(text, sample.label, metadata)

    async def grader(args, sample, text: str, *, answer_only: bool, **kwargs):
        """Score `text` (whole response, or the bare answer when `answer_only`)."""
        if kwargs:
            raise TypeError(f"rm_type {name!r} takes no options, got {sorted(kwargs)}")
        return await asyncio.to_thread(score, sample, text, answer_only)

    grader.__qualname__ = f"local_grader[{name}]"
    grader.score = score
    return grader


async def _random_grader(args, sample, text: str, *, answer_only: bool, **kwargs) -> float:
    """0.0 or 1.0, reproducible per sample: seeded from sample.index when it is set."""
    if kwargs:
        raise TypeError(f"rm_type 'random' takes no options, got {sorted(kwargs)}")
    index = getattr(sample, "index", None)
    rng = random.Random(index) if index is not None else random.Random()
    return float(rng.randint(0, 1))


async def _remote_grader(args, sample, text: str, *, answer_only: bool, **kwargs):
    """POST to --rm-url with `text` as the response (see remote_rm.remote_rm for the options)."""
    return await remote_rm(args, sample, response=text, **kwargs)


async def _char_match_grader(args, sample, text: str, *, answer_only: bool, **kwargs) -> float:
    """Per-character credit against the label, plus the stop after the answer (not for boxed_)."""
    if kwargs:
        raise TypeError(f"rm_type 'char_match' takes no options, got {sorted(kwargs)}")
    if answer_only:
        return char_match_score(text, sample.label, None)
    stopped = sample.status == sample.Status.COMPLETED
    # the answer's tokens: the response without its end-of-turn token (unknown before generation)
    num_tokens = sample.response_length - int(stopped) if sample.response_length else None
    return char_match_score(text, sample.label, stopped, num_tokens)


def _plain(fn: Callable[[str, Any], Any]) -> LocalFn:
    """Adapt `fn(text, label)` to the `(text, label, metadata)` scorer signature."""
    return lambda text, label, _metadata: fn(text, label)


REWARD_TYPES: MappingProxyType[str, Grader] = MappingProxyType(
    {
        "deepscaler": _local(
            "deepscaler", _plain(get_deepscaler_rule_based_reward), _plain(grade_answer)
        ),
        "math": _local("math", _plain(grade_math), _plain(grade_answer)),
        "dapo": _local("dapo", _plain(compute_score), _plain(score_answer)),
        "f1": _local("f1", _plain(grade_f1), _plain(grade_f1)),
        "gpqa": _local("gpqa", grade_gpqa, grade_gpqa),
        "remote_rm": _remote_grader,
        "random": _random_grader,
        "char_match": _char_match_grader,
    }
)


def known_rm_types() -> list[str]:
    """All accepted `--rm-type` values, including the boxed_ variants."""
    return sorted(REWARD_TYPES) + sorted(BOXED_PREFIX + name for name in REWARD_TYPES)


def _grader_and_text(rm_type: str) -> tuple[Grader, bool, Callable[[Any], str]]:
    """(grader, answer_only, sample -> the text it scores) for `rm_type` (maybe boxed_-prefixed).
    Raises UnknownRewardTypeError (a ValueError and a NotImplementedError) naming the type and the
    accepted ones when it is unknown."""
    name = rm_type.strip()
    boxed = name.startswith(BOXED_PREFIX)
    base = name[len(BOXED_PREFIX) :] if boxed else name
    if base not in REWARD_TYPES:
        raise UnknownRewardTypeError(f"unknown rm_type {rm_type!r}; known: {', '.join(known_rm_types())}")

    def text_of(sample) -> str:
        text = sample.response or ""
        return (extract_boxed_answer(text) or "") if boxed else text

    return REWARD_TYPES[base], boxed, text_of


def get_reward_fn(rm_type: str) -> Callable[..., Awaitable[Any]]:
    """The reward function `async fn(args, sample, **kwargs)` for `rm_type` (maybe boxed_-prefixed).
    Raises UnknownRewardTypeError when it is unknown."""
    grader, boxed, text_of = _grader_and_text(rm_type)

    async def reward(args, sample, **kwargs):
        """Reward of `sample` under `rm_type`."""
        return await grader(args, sample, text_of(sample), answer_only=boxed, **kwargs)

    return reward


def local_score_fn(rm_type: str) -> Callable[[Any], Any] | None:
    """`fn(sample) -> reward` computed in the calling thread, for the types scored by a pure local
    function (math, deepscaler, dapo, f1, gpqa, and their boxed_ forms); None for the others. The
    same value as `get_reward_fn(rm_type)(args, sample)`; lets a caller score many samples in one
    worker thread instead of one thread hop each."""
    grader, boxed, text_of = _grader_and_text(rm_type)
    score = getattr(grader, "score", None)
    return None if score is None else (lambda sample: score(sample, text_of(sample), boxed))
