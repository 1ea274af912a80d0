"""Memory release and resume of the local engine, by SGLang's tags.

Owns `EngineMemory`, behind `POST /release_memory_occupation` and `/resume_memory_occupation`
(body `{"tags": [...]}`, absent or null = every tag, as SGLang's `ReleaseMemoryOccupationReqInput`).
The tags are SGLang's (`sglang.srt.constants`): ``weights``, ``kv_cache``, ``cuda_graph``.

- ``kv_cache``: the KV cache tensors are dropped (requests still queued while generation is paused
  are aborted). This engine's cache grows per batch (no preallocated pool), so resuming only lets
  it be built again.
- ``weights``: the parameters are moved away -- on CUDA into host memory, on CPU into a torch file
  in a private temp dir -- and become empty tensors; resuming puts the same bytes back. Weight
  updates are refused while the weights are released, accepted as soon as they are resumed (the
  colocated loop resumes the weights, syncs, then resumes the KV cache).
- ``cuda_graph``: accepted for SGLang parity; this engine captures no graphs and holds 0 bytes.

Strict where SGLang is (its scheduler asserts, and dies, where this engine answers 400): a release
while the scheduler is not idle (requests running, or waiting while generation is not paused:
/flush_cache's condition) is refused, as is a resume of a tag that is not released (tags null
= every tag, so all must be released).

Generation is held (requests queue, nothing is lost) while the weights or the KV cache are released.
`occupation()` reports what is held, for `/get_server_info`'s ``memory_occupation``.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch

from slime.backends.local_engine.sampling import RequestError

WEIGHTS, KV_CACHE, CUDA_GRAPH = "weights", "kv_cache", "cuda_graph"
ALL_TAGS = (KV_CACHE, WEIGHTS, CUDA_GRAPH)  # sglang.srt.constants.GPU_MEMORY_ALL_TYPES
_HOLDS_GENERATION = (WEIGHTS, KV_CACHE)


def _tags(tags) -> list[str]:
    if tags is None:
        return list(ALL_TAGS)
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise RequestError("tags must be a list of strings or null")
    unknown = [t for t in tags if t not in ALL_TAGS]
    if unknown:
        raise RequestError(f"unknown memory tag(s) {unknown}; known: {list(ALL_TAGS)}")
    return tags


class EngineMemory:
    """Releases and resumes the model's weights and the scheduler's KV cache separately."""

    def __init__(self, model, scheduler) -> None:
        self.model, self.scheduler = model, scheduler
        self.released: set[str] = set()
        self._stash: dict | None = None

    @property
    def weights_released(self) -> bool:
        return WEIGHTS in self.released

    def release(self, tags=None) -> None:
        """Give back the memory of `tags` (None: all); already released tags are left as they are.
        Refused (RequestError) unless the scheduler is idle."""
        tags = _tags(tags)
        if not self.scheduler.idle():
            load = self.scheduler.load()
            raise RequestError(f"release_memory_occupation should be called only when server is idle "
                               f"(#running-req: {load['running']}, #queue-req: {load['waiting']}); "
                               "pause generation and wait for /flush_cache to answer 200 first")
        tags = [t for t in tags if t not in self.released]
        for tag in tags:
            if tag in _HOLDS_GENERATION:
                self.scheduler.hold(f"released:{tag}", True)
        if any(t in _HOLDS_GENERATION for t in tags):
            self.scheduler.drop_cache()  # aborts in-flight requests: their KV rows go with the cache
        if WEIGHTS in tags:
            self._release_weights()
        self.released.update(tags)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def resume(self, tags=None) -> None:
        """Take back the memory of `tags` (None: all); generation continues once weights and KV
        cache are both back. Refused (RequestError) if any of `tags` is not released."""
        tags = _tags(tags)
        not_released = [t for t in tags if t not in self.released]
        if not_released:
            raise RequestError(f"cannot resume memory tag(s) {not_released}: not released "
                               f"(released: {sorted(self.released)})")
        if WEIGHTS in tags:
            self._resume_weights()
        for tag in tags:
            self.released.discard(tag)
            if tag in _HOLDS_GENERATION:
                self.scheduler.hold(f"released:{tag}", False)

    def _params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    def _release_weights(self) -> None:
        with self.scheduler.model_lock:
            params = self._params()
            if next(iter(params.values())).device.type == "cuda":
                self._stash = {"cpu": {n: p.data.to("cpu") for n, p in params.items()}}
            else:
                folder = tempfile.mkdtemp(prefix="slime_engine_released_")
                torch.save({n: p.data for n, p in params.items()}, os.path.join(folder, "weights.pt"))
                self._stash = {"folder": folder}
            for p in params.values():
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _resume_weights(self) -> None:
        with self.scheduler.model_lock:
            stash, self._stash = self._stash, None
            if "cpu" in stash:
                saved = stash["cpu"]
            else:
                saved = torch.load(os.path.join(stash["folder"], "weights.pt"))
                shutil.rmtree(stash["folder"])
            for name, p in self._params().items():
                p.data = saved[name].to(p.device)

    def occupation(self) -> dict:
        """`{"weights_bytes", "kv_cache_bytes", "cuda_graph_bytes", "released_tags"}`: bytes held
        on the engine's device now per tag, and the tags released (SGLang's names, sorted)."""
        weights = sum(p.numel() * p.element_size() for p in self._params().values())
        kv = self.scheduler.kv_cache_bytes()
        return {"weights_bytes": weights, "kv_cache_bytes": kv, "cuda_graph_bytes": 0,
                "released_tags": sorted(self.released)}
