"""slime's `GenerateState`: the job's rollout state that custom generate functions read.

`GenerateState(args)` returns the same object for every call with the same `args` (one per job, as
slime's `SingletonMeta` gives per process), without module-level state: the object is kept on
`args` itself (attribute `STATE_ATTR`). Pickling or deep-copying `args` (a Ray actor, a checkpoint)
drops it, so a copy of `args` in another process builds its own state there.

Fields, as in slime: `args`, `tokenizer`, `processor` (None for a text model; loaded on first use),
`semaphore` (`--sglang-server-concurrency` x engines requests in flight), `sampling_params` (the
rollout flags' defaults; copy before changing), `aborted` (set when the rollout aborts what is
still generating; a custom generate function should then stop and mark its sample aborted),
`remaining_batch_size` (groups submitted and not filtered out), `pendings` (the set of in-flight
group tasks), `dp_counts` / `dp_rank` / `dp_rank_context()`, `reset()` and
`submit_generate_tasks(groups)`; ours: `slots(n)` (n of the semaphore's permits at once, for a
group's batched request) and `client_pool()` (the HTTP clients the default rollout keeps
across rollouts). The default rollout shares the semaphore, tokenizer and abort flag with this
object and calls `reset()` after every train and eval rollout.

`RolloutContext`: what one call of the default rollout shares (the job's `GenerateState`, the
router client, the clients of requests that go straight to engines, the plugins), opened per
rollout call and closed when it ends (the HTTP clients are the job's `ClientPool`'s on the
background loop, and stay open). `slime.rollout.sglang_rollout` re-exports it. The state and the
context live together because each needs the other (the context shares the state; the state's
`submit_generate_tasks` opens a context per group for `slime.rollout.group_generate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable

from slime.rollout.client_pool import ClientPool
from slime.rollout.direct_engines import DirectEngines
from slime.rollout.group_generate import generate_and_rm_group
from slime.rollout.router_requests import ROUTER_DEFAULT_REQUEST_TIMEOUT_S, router_client
from slime.utils.async_utils import on_background_loop
from slime.utils.data import load_tokenizer
from slime.utils.engine_client import EngineClient
from slime.utils.misc import load_function
from slime.utils.plugins import current_rollout_id

STATE_ATTR = "_slime_generate_state"


def sampling_params_from_args(args, evaluation: bool = False) -> dict:
    """SGLang sampling params for train or eval rollouts (eval flags fall back to rollout ones)."""

    def pick(eval_name: str, name: str):
        value = getattr(args, eval_name, None) if evaluation else None
        return getattr(args, name) if value is None else value

    return {
        "temperature": pick("eval_temperature", "rollout_temperature"),
        "top_p": pick("eval_top_p", "rollout_top_p"),
        "top_k": pick("eval_top_k", "rollout_top_k"),
        "max_new_tokens": pick("eval_max_response_len", "rollout_max_response_len"),
        "stop": args.rollout_stop,
        "stop_token_ids": args.rollout_stop_token_ids,
        "skip_special_tokens": args.rollout_skip_special_tokens,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


def rollout_concurrency(args) -> int:
    """Requests the rollout keeps in flight: `--sglang-server-concurrency` per engine
    (`--rollout-num-gpus` / `--rollout-num-gpus-per-engine` engines, at least one)."""
    engines = max(1, (args.rollout_num_gpus or 1) // args.rollout_num_gpus_per_engine)
    return args.sglang_server_concurrency * engines


def _dropped():
    """What a pickled or copied `GenerateState` becomes: nothing (rebuilt where it is needed)."""
    return None


class GenerateState:
    """The job's generation state; `GenerateState(args)` is the same object for the same `args`."""

    def __new__(cls, args):
        state = getattr(args, STATE_ATTR, None)
        if isinstance(state, GenerateState):
            return state
        state = super().__new__(cls)
        state._build(args)
        setattr(args, STATE_ATTR, state)
        return state

    def __init__(self, args) -> None:
        """Built once per `args` (in `__new__`); later calls return the same object unchanged."""

    def _build(self, args) -> None:
        self.args = args
        self.tokenizer = load_tokenizer(args.hf_checkpoint)
        self.concurrency = rollout_concurrency(args)
        self.sampling_params = sampling_params_from_args(args)
        self.dp_counts = [0] * (getattr(args, "sglang_dp_size", None) or 1)
        self.dp_rank = 0
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_loop = None
        self._slots_lock: asyncio.Lock | None = None
        self._pool: ClientPool | None = None
        self.reset()

    def __reduce__(self):
        return _dropped, ()

    @functools.cached_property
    def processor(self):
        """slime's processor: None for a text model (multimodal prompts are not implemented)."""
        from slime.utils.processing_utils import load_processor

        return load_processor(self.args.hf_checkpoint, trust_remote_code=True)

    @property
    def semaphore(self) -> asyncio.Semaphore:
        """At most `concurrency` generations at once. One semaphore per event loop: the default
        rollout runs on the process's background loop (`slime.utils.async_utils.run`), a custom
        rollout function may run its own, and an asyncio semaphore cannot cross loops."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # read outside a loop: the one of the last loop (or a new one)
            loop = self._semaphore_loop
        if self._semaphore is None or loop is not self._semaphore_loop:
            self._semaphore, self._semaphore_loop = asyncio.Semaphore(self.concurrency), loop
            self._slots_lock = asyncio.Lock()
        return self._semaphore

    def client_pool(self) -> ClientPool | None:
        """The job's HTTP clients (`client_pool.ClientPool`) when called on the process's
        background loop, where the default rollout runs; None elsewhere (a custom rollout's own
        loop: its calls open and close their clients, which cannot outlive that loop)."""
        if not on_background_loop():
            return None
        if self._pool is None:
            self._pool = ClientPool()
        return self._pool

    @contextlib.asynccontextmanager
    async def slots(self, n: int):
        """Hold `n` of the semaphore's permits at once, for one request that carries `n` generations
        (a group's batched `/generate`). Several-permit acquirers take turns (a lock), so two of them
        each holding part of what they need cannot wait on each other forever; `n` must be in
        [1, concurrency] (a larger group is sent in chunks)."""
        if not 1 <= n <= self.concurrency:
            raise ValueError(f"{n} permits asked of a semaphore of {self.concurrency} (--sglang-server-concurrency)")
        semaphore = self.semaphore
        held = 0
        try:
            async with self._slots_lock:
                for _ in range(n):
                    await semaphore.acquire()
                    held += 1
            yield
        finally:
            for _ in range(held):
                semaphore.release()

    def reset(self) -> None:
        """Forget one rollout's progress: nothing pending, nothing aborted (slime's reset)."""
        self.remaining_batch_size = 0
        self.pendings: set[asyncio.Task] = set()
        self.aborted = False

    @contextlib.contextmanager
    def dp_rank_context(self):
        """Yield the least-loaded SGLang data-parallel rank (`--sglang-dp-size`) for one request."""
        rank = self.dp_counts.index(min(self.dp_counts))
        self.dp_counts[rank] += 1
        self.dp_rank = rank
        try:
            yield rank
        finally:
            self.dp_counts[rank] -= 1

    def submit_generate_tasks(self, groups) -> None:
        """Start `generate_and_rm_group` for every group (slime's): the tasks join `pendings`. Each
        group runs in a context of its own, as slime's `generate_and_rm_group(args, ...)` does."""
        for group in groups:
            task = asyncio.ensure_future(
                with_context(self.args, generate_and_rm_group, group, self.sampling_params.copy(), False))
            self.pendings.add(task)
        self.remaining_batch_size += len(groups)


def close_job_clients(args) -> None:
    """The job's end: close the HTTP clients `args`'s `GenerateState` kept across rollouts (on the
    background loop, where they were used); nothing when no state or no pool was made."""
    state = getattr(args, STATE_ATTR, None)
    pool = state._pool if isinstance(state, GenerateState) else None
    if pool is not None:
        state._pool = None
        pool.shutdown()


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


async def with_context(args, fn, *call_args):
    """`fn(ctx, *call_args)` in a context of its own (slime-style calls that pass `args`)."""
    ctx = RolloutContext.create(args, current_rollout_id())
    async with ctx:
        return await fn(ctx, *call_args)
