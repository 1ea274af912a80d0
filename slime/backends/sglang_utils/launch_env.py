"""The environment of an SGLang server process: what slime sets in it and what it removes.

Owns `SERVER_ENV`, `MEMORY_SAVER_ENV`, `REMOVED_ENV` and `server_env`. Names and meanings were
read in SGLang 0.5.23's and 0.5.15.post1's `srt/environ.py` and their users; both releases read
the same names.

- `SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false`: /health generates a token unless told not to
  (0.5.15.post1 and 0.5.23); a probe would then put a request in flight and race
  /release_memory_occupation, which SGLang runs only when idle. /health_generate still generates.
- `SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=false`: the scheduler's idle invariant check
  compares the KV pool's free slots with its size; released / resumed memory (--offload-rollout)
  and aborted requests around weight updates make it fire on a healthy engine.
- `SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false`: at start each TP rank's free memory must be
  within a margin of the others'; colocated with the trainer, ranks see its offloaded-but-cached
  memory unevenly.
- `SGLANG_MEMORY_SAVER_CUDA_GRAPH=true` (engines with the memory saver, i.e. --offload-rollout):
  only then are CUDA graphs captured inside the memory saver, so that releasing the `cuda_graph`
  tag frees them. SGLang's breakable prefill graph backend (the default of both releases)
  raises NotImplementedError with it, so `memory_saver_fields` disables the prefill graph
  (`cuda_graph_backend_prefill: disabled`); decode graphs stay.
- `PYTORCH_CUDA_ALLOC_CONF` is removed: the job's allocator settings (e.g. expandable segments
  for the trainer) break the memory saver's own allocations in SGLang.
These are what slime sets for its SGLang engines (its `sglang_engine.py`).
"""

from __future__ import annotations

SERVER_ENV = {
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "false",
    "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "false",
}
MEMORY_SAVER_ENV = {"SGLANG_MEMORY_SAVER_CUDA_GRAPH": "true"}
REMOVED_ENV = ("PYTORCH_CUDA_ALLOC_CONF",)
# ServerArgs fields an engine with the memory saver needs (see the module docstring).
MEMORY_SAVER_FIELDS = {"cuda_graph_backend_prefill": "disabled"}


def memory_saver_fields(fields: dict) -> dict:
    """`MEMORY_SAVER_FIELDS` when `fields` enable the memory saver, else {}."""
    return dict(MEMORY_SAVER_FIELDS) if fields.get("enable_memory_saver") else {}


def server_env(fields: dict, inherited: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the SGLang process for ServerArgs `fields`: `inherited` (the parent's)
    without `REMOVED_ENV`, plus `SERVER_ENV`, `MEMORY_SAVER_ENV` when `fields` enable the memory
    saver, then `extra` (the caller's, which wins)."""
    env = {name: value for name, value in inherited.items() if name not in REMOVED_ENV}
    env.update(SERVER_ENV)
    if fields.get("enable_memory_saver"):
        env.update(MEMORY_SAVER_ENV)
    env.update(extra or {})
    return env
