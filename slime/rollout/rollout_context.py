"""`RolloutContext`: what one call of the default rollout shares (the job's `GenerateState`, the
router client, the clients of requests that go straight to engines, the plugins), opened per
rollout call and closed when it ends (the HTTP clients are the job's `ClientPool`'s on the
background loop, and stay open). `slime.rollout.sglang_rollout` re-exports it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from slime.rollout.client_pool import ClientPool
from slime.rollout.direct_engines import DirectEngines
from slime.rollout.generate_state import GenerateState
from slime.rollout.router_requests import ROUTER_DEFAULT_REQUEST_TIMEOUT_S, router_client
from slime.utils.engine_client import EngineClient
from slime.utils.misc import load_function


@dataclass
class RolloutContext:
    """Everything one rollout call shares: the job's `GenerateState` (tokenizer, concurrency,
    abort flag), the router client and the plugins."""

    args: object
    rollout_id: int | None
    client: EngineClient
    state: GenerateState
    custom_generate: Callable | None = None
    sample_hooks: list[Callable] = field(default_factory=list)
    direct: DirectEngines | None = None  # R3 and group requests bypass the router (direct_engines.py)
    pool: ClientPool | None = None  # the job's clients (client_pool.py): `client` and `direct` are the pool's
    teacher: EngineClient | None = None  # --use-opd --opd-type sglang: the teacher's server (opd_teacher.py)
    _prompt_ids: dict = field(default_factory=dict, repr=False)  # prompt text -> token ids, this rollout's

    @property
    def tokenizer(self):
        return self.state.tokenizer

    def prompt_ids(self, prompt) -> list[int]:
        """`prompt`'s token ids (no special tokens added), a fresh list; a text prompt is tokenized
        once per rollout call, since the `--n-samples-per-prompt` samples of a group share it."""
        if not isinstance(prompt, str):
            return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if prompt not in self._prompt_ids:
            self._prompt_ids[prompt] = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return list(self._prompt_ids[prompt])

    @property
    def semaphore(self) -> asyncio.Semaphore:
        return self.state.semaphore

    @property
    def aborted(self) -> bool:
        """The job's abort flag (`GenerateState.aborted`), seen by custom generate functions too."""
        return self.state.aborted

    @aborted.setter
    def aborted(self, value: bool) -> None:
        self.state.aborted = value

    async def __aenter__(self) -> "RolloutContext":
        return self

    async def __aexit__(self, *exc) -> None:
        if self.direct is not None:
            await self.direct.close()
        if self.teacher is not None:
            await self.teacher.close()
        if self.pool is None:
            await self.client.close()

    def direct_engines(self) -> DirectEngines:
        """Round-robin clients of the router's engines, for requests the router cannot carry."""
        if self.direct is None:
            self.direct = DirectEngines(self.client, self.pool)
        return self.direct

    async def generate_client(self, payload: dict) -> EngineClient:
        """The router, or an engine for a request the router would strip (routed experts)."""
        if not payload.get("return_routed_experts"):
            return self.client
        return await self.direct_engines().pick()

    @classmethod
    def create(cls, args, rollout_id=None) -> "RolloutContext":
        state = GenerateState(args)
        pool = state.client_pool()  # on the background loop: the job's clients, kept across calls
        return cls(
            args=args,
            rollout_id=rollout_id,
            client=router_client(args, pool),
            state=state,
            pool=pool,
            custom_generate=maybe_load(args.custom_generate_function_path),
            sample_hooks=[load_function(p) for p in (args.rollout_sample_hook_path or [])],
            teacher=_teacher_client(args),
        )


def _teacher_client(args) -> EngineClient | None:
    if not (getattr(args, "use_opd", False) and args.opd_type == "sglang"):
        return None
    timeout = getattr(args, "router_request_timeout_secs", None) or ROUTER_DEFAULT_REQUEST_TIMEOUT_S
    return EngineClient(args.opd_teacher_url, timeout=float(timeout))


def maybe_load(path):
    """`load_function(path)`, or None without a path."""
    return load_function(path) if path else None
