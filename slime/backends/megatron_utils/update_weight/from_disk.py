"""Weight sync through an HF checkpoint folder on a filesystem the engines can read.

Owns `UpdateWeightFromDisk`. The leader empties `directory` while the engines are paused; each
sending rank (one per pipeline stage) writes its buckets as `model-<stage>-<n>.safetensors`; the
leader then writes `model.safetensors.index.json` (names read back from the files' headers), copies
config / tokenizer files from `hf_checkpoint`, calls `post_write(directory, engine_urls)` if given
(slime's --custom-update-weight-post-write-path, bound to args by `build_weight_sender`), and POSTs /update_weights_from_disk to every engine.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable

from slime.backends.megatron_utils.hf_io import AUX_FILES, INDEX_FILE
from slime.backends.megatron_utils.update_weight.common import TrainerRole, WeightSender

logger = logging.getLogger(__name__)


class UpdateWeightFromDisk(WeightSender):
    """Disk sender; `directory` must be the same path for the trainer ranks and the engines."""

    ENDPOINT = "update_weights_from_disk"

    def __init__(self, engine_urls, buckets, directory, hf_checkpoint, role: TrainerRole = TrainerRole(),
                 timeout: float = 600.0, post_write: Callable[[str, list], None] | None = None) -> None:
        super().__init__(engine_urls, buckets, role, timeout)
        self.directory, self.hf_checkpoint = Path(directory), Path(hf_checkpoint)
        self.post_write = post_write
        self._files = 0

    def before_send(self, version: str) -> None:
        """Start from an empty folder (old shards would be loaded too)."""
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)

    def send_bucket(self, bucket: list, version: str) -> None:
        """Write one bucket as its own safetensors file."""
        from safetensors.torch import save_file

        self._files += 1
        path = self.directory / f"model-{self.role.stage_tag}-{self._files:05d}.safetensors"
        save_file({n: t.detach().contiguous().cpu() for n, t in bucket}, str(path), metadata={"format": "pt"})

    def after_send(self, version: str) -> None:
        """Index + config/tokenizer files, then every engine loads the folder."""
        from safetensors import safe_open

        weight_map, total = {}, 0
        for path in sorted(self.directory.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    weight_map[name] = path.name
                    sl = handle.get_slice(name)
                    total += _nbytes(sl.get_shape(), sl.get_dtype())
        index = {"metadata": {"total_size": total, "weight_version": version}, "weight_map": weight_map}
        (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
        for aux in AUX_FILES:
            if (self.hf_checkpoint / aux).is_file():
                shutil.copyfile(self.hf_checkpoint / aux, self.directory / aux)
        if self.post_write is not None:
            self.post_write(str(self.directory), list(self.engine_urls))
        self.on_engines(lambda c, _i: c.update_weights_from_disk(str(self.directory), weight_version=version))


_DTYPE_BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2, "U8": 1, "I8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _nbytes(shape, dtype: str) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count * _DTYPE_BYTES[dtype]
