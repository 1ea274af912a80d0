"""The `Sample` record that flows from prompt data through rollout into training, and plugin types.

Owns the `Sample` dataclass (field order and defaults are part of the slime compatibility
surface, see docs/slime-compat.md §4), its nested `Status` enum, the small speculative-decoding
and prefix-cache counters it carries, and (de)serialisation to plain dicts.

It also defines the plugin return types `RolloutFnTrainOutput`, `RolloutFnEvalOutput` and
`DynamicFilterOutput`. They live here so that `slime.utils.plugins` can check them without
importing `slime.rollout` (imports flow utils <- rollout); users import them from their slime
paths, `slime.rollout.base_types` and `slime.rollout.filter_hub.base_types`, which re-export
these very classes.

Unknown keys given to `Sample.from_dict` are kept as plain instance attributes (as slime does):
they are readable as `sample.<key>`, and `to_dict()` emits them again, so they survive a round
trip through `to_dict()` / `from_dict()`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    """One prompt and (after rollout) one response, with everything training needs from it.

    `tokens` holds prompt + response token ids; `loss_mask` and `rollout_log_probs`, when set,
    have length `response_length`.
    """

    class Status(Enum):
        """Lifecycle of a sample; the string values are what `to_dict` writes.

        A plain Enum as in slime: `status == "completed"` is False, compare with members.
        """

        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    @dataclass
    class SpecInfo:
        """Speculative-decoding counters accumulated over a sample's generation turns."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def add(self, meta_info: dict) -> None:
            """Accumulate the counters an SGLang `meta_info` reports (missing keys count as 0)."""
            self.spec_accept_token_num += int(meta_info.get("spec_accept_token_num", 0) or 0)
            self.spec_draft_token_num += int(meta_info.get("spec_draft_token_num", 0) or 0)
            self.spec_verify_ct += int(meta_info.get("spec_verify_ct", 0) or 0)
            self.completion_token_num += int(meta_info.get("completion_tokens", 0) or 0)

        @property
        def spec_accept_rate(self) -> float:
            """Accepted draft tokens / drafted tokens (0.0 when nothing was drafted)."""
            if self.spec_draft_token_num == 0:
                return 0.0
            return self.spec_accept_token_num / self.spec_draft_token_num

        @property
        def spec_accept_length(self) -> float:
            """Completion tokens per verify step (0.0 before any verify step)."""
            if self.spec_verify_ct == 0:
                return 0.0
            return self.completion_token_num / self.spec_verify_ct

        def to_dict(self) -> dict:
            """The four counters as a plain dict."""
            return dataclasses.asdict(self)

        @staticmethod
        def from_dict(data: dict) -> "Sample.SpecInfo":
            """Inverse of `to_dict`; missing keys default to 0 and unknown keys are ignored."""
            return _dataclass_from_dict(Sample.SpecInfo, data)

    @dataclass
    class PrefixCacheInfo:
        """Prefix-cache counters: prompt tokens served from the engine's cache vs all prompt tokens."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info: dict) -> None:
            """Accumulate `cached_tokens` / `prompt_tokens` from an SGLang `meta_info`."""
            self.cached_tokens += int(meta_info.get("cached_tokens", 0) or 0)
            self.total_prompt_tokens += int(meta_info.get("prompt_tokens", 0) or 0)

        @property
        def prefix_cache_hit_rate(self) -> float:
            """Cached prompt tokens / prompt tokens (0.0 when no prompt tokens were seen)."""
            if self.total_prompt_tokens == 0:
                return 0.0
            return self.cached_tokens / self.total_prompt_tokens

        def to_dict(self) -> dict:
            """The two counters as a plain dict."""
            return dataclasses.asdict(self)

        @staticmethod
        def from_dict(data: dict) -> "Sample.PrefixCacheInfo":
            """Inverse of `to_dict`; missing keys default to 0 and unknown keys are ignored."""
            return _dataclass_from_dict(Sample.PrefixCacheInfo, data)

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict | None = None
    multimodal_train_inputs: dict | None = None
    multimodal_train_input_id: Any = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list | None = None
    rollout_top_p_token_offsets: list | None = None
    rollout_routed_experts: list | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: SpecInfo = field(default_factory=lambda: Sample.SpecInfo())
    prefix_cache_info: PrefixCacheInfo = field(default_factory=lambda: Sample.PrefixCacheInfo())

    def to_dict(self) -> dict:
        """Plain-dict form: status becomes its string value, the counters become dicts.

        Extra attributes set on the instance (e.g. unknown keys from `from_dict`) are included.
        """
        out = dict(self.__dict__)
        out["status"] = Sample.Status(self.status).value
        out["spec_info"] = self.spec_info.to_dict()
        out["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return out

    @staticmethod
    def from_dict(data: dict) -> "Sample":
        """Inverse of `to_dict` (slime: a staticmethod; the "status" key is required).

        Keys that are not fields become instance attributes; a key that would shadow a method or
        class attribute raises ValueError (slime would silently shadow it).
        """
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        if isinstance(data.get("spec_info"), dict):
            data["spec_info"] = Sample.SpecInfo.from_dict(data["spec_info"])
        if isinstance(data.get("prefix_cache_info"), dict):
            data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data["prefix_cache_info"])
        names = {f.name for f in dataclasses.fields(Sample)}
        clashes = sorted(k for k in data if k not in names and hasattr(Sample, k))
        if clashes:
            raise ValueError(f"Sample.from_dict: keys {clashes} would shadow Sample attributes")
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def append_response_tokens(
        self,
        args=None,
        *,
        tokens=None,
        log_probs=None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Append one generation turn (or non-trainable tool/env tokens) to the response.

        slime's contract (docs/plugins.md): extends tokens, response, response_length, loss_mask
        (1 trainable / 0 not) and rollout_log_probs (0.0 for non-trainable tokens), merges top-p
        replay data and routed experts from `meta_info`, applies the finish reason, and checks
        that every per-token field still has response_length entries. Raises ValueError on
        inconsistent input.
        """
        from slime.utils.sample_append import append_response_tokens

        append_response_tokens(
            self, args, tokens=tokens, log_probs=log_probs, trainable=trainable,
            meta_info=meta_info, text=text, update_terminal_info=update_terminal_info,
        )

    def get_reward_value(self, args) -> Any:
        """The scalar reward: `reward[args.reward_key]` when `--reward-key` is set, else `reward`."""
        key = getattr(args, "reward_key", None)
        if not key:
            return self.reward
        if not isinstance(self.reward, dict):
            raise TypeError(
                f"--reward-key {key!r} is set but sample {self.index} has a non-dict reward "
                f"{self.reward!r}"
            )
        if key not in self.reward:
            raise KeyError(
                f"--reward-key {key!r} not in sample {self.index}'s reward dict "
                f"(keys: {sorted(self.reward)})"
            )
        return self.reward[key]

    @property
    def effective_response_length(self) -> int:
        """Number of response tokens that are trained on (sum of `loss_mask`, else all)."""
        if self.loss_mask is not None:
            return int(sum(self.loss_mask))
        return self.response_length

    @staticmethod
    def status_from_finish_reason(finish_reason: str) -> "Sample.Status":
        """Map SGLang's `finish_reason.type` (stop / length / abort) to a `Sample.Status`."""
        if finish_reason not in _FINISH_REASON_TO_STATUS:
            raise ValueError(
                f"unknown SGLang finish_reason {finish_reason!r}; expected one of "
                f"{sorted(_FINISH_REASON_TO_STATUS)}"
            )
        return _FINISH_REASON_TO_STATUS[finish_reason]


# Module-level names kept for code that imported them from here.
SpecInfo = Sample.SpecInfo
PrefixCacheInfo = Sample.PrefixCacheInfo


def _dataclass_from_dict(cls, data: dict | None):
    """`cls(**known keys of data)`: missing keys take defaults, unknown keys are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in (data or {}).items() if k in names})


# Registry: SGLang `meta_info.finish_reason.type` -> Sample status.
_FINISH_REASON_TO_STATUS = {
    "stop": Sample.Status.COMPLETED,
    "length": Sample.Status.TRUNCATED,
    "abort": Sample.Status.ABORTED,
}


@dataclass
class RolloutFnTrainOutput:
    """Training rollout result: `samples[g]` is group g (n_samples_per_prompt Samples)."""

    samples: list[list[Sample]]
    metrics: dict | None = None


@dataclass
class RolloutFnEvalOutput:
    """Eval result: `data[name] = {"rewards": [...], "truncated": [...], "samples": [...]}`."""

    data: dict[str, dict]
    metrics: dict | None = None


@dataclass
class DynamicFilterOutput:
    """Whether to keep a sample group, and (when dropped) a short reason used in metrics."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False  # dropped, but used when the data runs out before the batch fills


@dataclass(frozen=True)
class ParamInfo:
    """One parameter's description for weight transfer (slime's record)."""

    name: str
    dtype: Any
    shape: Any
    attrs: dict
    size: int
    src_rank: int


# One rollout's train data on the trainer: per-sample lists (tensors, ints, floats or strings).
RolloutBatch = dict[str, list]


@dataclass(frozen=True)
class MultimodalType:
    """A modality and the placeholder that marks it in prompt text."""

    name: str
    placeholder: str


class MultimodalTypes:
    """The modalities slime knows (image / video / audio)."""

    IMAGE = MultimodalType("image", "<image>")
    VIDEO = MultimodalType("video", "<video>")
    AUDIO = MultimodalType("audio", "<audio>")

    @classmethod
    def all(cls) -> list[MultimodalType]:
        """Every modality, in the order image, video, audio."""
        return [cls.IMAGE, cls.VIDEO, cls.AUDIO]

    @classmethod
    def get(cls, name: str) -> MultimodalType | None:
        """The modality called `name`, or None."""
        return next((m for m in cls.all() if m.name == name), None)
