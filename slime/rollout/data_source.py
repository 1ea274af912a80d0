"""Where rollout prompts come from: the `DataSource` interface and slime's two implementations.

`RolloutDataSource` walks the `--prompt-data` Dataset epoch after epoch (reshuffled with seed
`rollout_seed + epoch` under `--rollout-shuffle`), hands out groups of `--n-samples-per-prompt`
deep-copied Samples, and saves / restores its position with the checkpoint at
`{--save}/rollout/global_dataset_state_dict_{rollout_id}.pt` (slime's layout).
`RolloutDataSourceWithBuffer` adds a buffer for groups handed back (aborted / partial rollouts),
served first through `--buffer-filter-path` (default `pop_first`). Users may replace the whole
thing with `--data-source-path`.
"""

from __future__ import annotations

import abc
import json
import logging
import pickle
import re
from pathlib import Path

import torch

from slime.utils.data import Dataset, build_samples, load_prompt_rows, load_tokenizer
from slime.utils.misc import load_function
from slime.utils.plugins import call_buffer_filter
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

_STATE_RE = re.compile(r"^global_dataset_state_dict_(\d+)\.pt$")


class DataSource(abc.ABC):
    """The interface of `--data-source-path` classes (slime's signature)."""

    def __init__(self, args):
        """Keep the parsed arguments."""
        self.args = args

    @abc.abstractmethod
    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """Return `num_samples` groups, each of `n_samples_per_prompt` Samples."""

    @abc.abstractmethod
    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Take groups back (e.g. aborted or partial rollouts)."""

    @abc.abstractmethod
    def save(self, rollout_id: int) -> None:
        """Persist the position reached after rollout `rollout_id`."""

    @abc.abstractmethod
    def load(self, rollout_id: int | None = None) -> None:
        """Restore the position saved at `rollout_id` (None: the latest saved one)."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of prompts in one epoch."""


def state_path(root: str, rollout_id: int) -> Path:
    """`{root}/rollout/global_dataset_state_dict_{rollout_id}.pt`."""
    return Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"


def latest_saved_rollout_id(root: str) -> int | None:
    """Highest rollout id with a saved data-source state under `{root}/rollout`, or None."""
    folder = Path(root) / "rollout"
    if not folder.is_dir():
        return None
    ids = [int(m[1]) for p in folder.iterdir() if (m := _STATE_RE.match(p.name))]
    return max(ids) if ids else None


def _template_kwargs(args) -> dict:
    value = getattr(args, "apply_chat_template_kwargs", None) or {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"--apply-chat-template-kwargs must be a JSON object, got {value!r}")
    return value


def load_prompt_dataset(args) -> Dataset:
    """Read `--prompt-data` into a Dataset with the data flags of `args` (§5 of slime-compat)."""
    if getattr(args, "prompt_data", None) is None:
        raise ValueError("--prompt-data is required to read rollout prompts (got None)")
    apply_template = bool(getattr(args, "apply_chat_template", False))
    max_len = getattr(args, "rollout_max_prompt_len", None)
    tokenizer = None
    if apply_template or max_len is not None:
        if getattr(args, "hf_checkpoint", None) is None:
            raise ValueError(
                "--apply-chat-template / --rollout-max-prompt-len need --hf-checkpoint (tokenizer)"
            )
        tokenizer = load_tokenizer(args.hf_checkpoint)
    input_key = getattr(args, "input_key", "input")
    rows = load_prompt_rows(args.prompt_data, input_key=input_key)
    samples = build_samples(
        rows,
        tokenizer=tokenizer,
        input_key=input_key,
        label_key=getattr(args, "label_key", None),
        metadata_key=getattr(args, "metadata_key", "metadata"),
        tool_key=getattr(args, "tool_key", "tools"),
        apply_chat_template=apply_template,
        apply_chat_template_kwargs=_template_kwargs(args),
        max_prompt_len=max_len,
        source=str(args.prompt_data),
    )
    return Dataset(samples)


class RolloutDataSource(DataSource):
    """Serves the `--prompt-data` prompts in groups, over epochs, resumable from checkpoints."""

    def __init__(self, args):
        """Load the dataset; position starts at epoch 0, offset 0."""
        super().__init__(args)
        self.dataset = load_prompt_dataset(args)
        self.n_samples_per_prompt = int(args.n_samples_per_prompt)
        self.epoch_id = 0
        self.sample_offset = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self._reshuffle()

    def _reshuffle(self) -> None:
        if getattr(self.args, "rollout_shuffle", False):
            self.dataset.shuffle(self.epoch_id, int(self.args.rollout_seed))

    def _next_prompt(self) -> Sample:
        if len(self.dataset) == 0:
            raise ValueError(f"--prompt-data {self.args.prompt_data!r} has no usable prompts")
        if self.sample_offset >= len(self.dataset):
            self.epoch_id += 1
            self.sample_offset = 0
            self._reshuffle()
        prompt = self.dataset[self.sample_offset]
        self.sample_offset += 1
        return prompt

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """Next `num_samples` prompts, each as a group of n_samples_per_prompt deep copies.

        Sets `group_index` (running group counter) and `index` (running sample counter).
        """
        groups = []
        for _ in range(num_samples):
            prompt = pickle.dumps(self._next_prompt(), protocol=pickle.HIGHEST_PROTOCOL)
            group = []
            for _ in range(self.n_samples_per_prompt):
                sample = pickle.loads(prompt)  # a deep copy (Samples cross processes pickled), 3x cheaper
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """The plain data source has no buffer; use RolloutDataSourceWithBuffer."""
        raise RuntimeError(
            "RolloutDataSource cannot take samples back; use "
            "slime.rollout.data_source.RolloutDataSourceWithBuffer (--data-source-path)"
        )

    def state_dict(self) -> dict:
        """The position: epoch, offset within the epoch, group / sample counters, dataset size."""
        return {
            "epoch_id": self.epoch_id,
            "sample_offset": self.sample_offset,
            "sample_group_index": self.sample_group_index,
            "sample_index": self.sample_index,
            "dataset_size": len(self.dataset),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` (reshuffling for the restored epoch)."""
        if state.get("dataset_size", len(self.dataset)) != len(self.dataset):
            logger.warning(
                "--prompt-data now has %d prompts, the saved state had %d; the position "
                "(epoch %d, offset %d) may not match the earlier order",
                len(self.dataset), state["dataset_size"], state["epoch_id"], state["sample_offset"],
            )
        self.epoch_id = int(state["epoch_id"])
        self.sample_offset = int(state["sample_offset"])
        self.sample_group_index = int(state["sample_group_index"])
        self.sample_index = int(state["sample_index"])
        self._reshuffle()

    def save(self, rollout_id: int) -> None:
        """Write the position to `{--save}/rollout/global_dataset_state_dict_{rollout_id}.pt`."""
        if getattr(self.args, "save", None) is None:
            logger.debug("--save not set: data-source position of rollout %d not saved", rollout_id)
            return
        path = state_path(self.args.save, rollout_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path)

    def load(self, rollout_id: int | None = None) -> None:
        """Restore the position saved under `--load` at `rollout_id` (None: latest).

        Without `--load` or a saved state, the source starts fresh (logged).
        """
        root = getattr(self.args, "load", None)
        if root is None:
            return
        if rollout_id is None:
            rollout_id = latest_saved_rollout_id(root)
        path = state_path(root, rollout_id) if rollout_id is not None else None
        if path is None or not path.is_file():
            logger.info("no data-source state under %s/rollout for rollout %s: start fresh",
                        root, rollout_id)
            return
        self.load_state_dict(torch.load(path, weights_only=True))
        logger.info("data source resumed from %s: %s", path, self.state_dict())

    def __len__(self) -> int:
        return len(self.dataset)


def pop_first(args, rollout_id, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """Default `--buffer-filter-path`: the oldest `num_samples` groups (first in, first out)."""
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """RolloutDataSource plus a buffer of handed-back groups, served before new prompts."""

    def __init__(self, args):
        """Load the dataset and the buffer filter (`--buffer-filter-path`, default pop_first)."""
        super().__init__(args)
        self.buffer: list[list[Sample]] = []
        path = getattr(args, "buffer_filter_path", None)
        self.buffer_filter = load_function(path) if path else pop_first

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """Up to `num_samples` groups from the buffer (via the filter), the rest from the data.
        As in slime, the filter is not called while the buffer is empty."""
        if not self.buffer:
            return super().get_samples(num_samples)
        taken = call_buffer_filter(self.buffer_filter, self.args, None, self.buffer, num_samples)
        if len(taken) > num_samples:
            raise ValueError(
                f"--buffer-filter-path returned {len(taken)} groups, more than the "
                f"{num_samples} asked for"
            )
        return taken + super().get_samples(num_samples - len(taken))

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Put groups back (each must hold n_samples_per_prompt Samples)."""
        for i, group in enumerate(samples):
            if not isinstance(group, list) or len(group) != self.n_samples_per_prompt:
                raise ValueError(
                    f"add_samples: group {i} must be a list of --n-samples-per-prompt "
                    f"({self.n_samples_per_prompt}) Samples, got {group!r:.200}"
                )
            self.buffer.append(group)

    def get_buffer_length(self) -> int:
        """Number of groups waiting in the buffer."""
        return len(self.buffer)
