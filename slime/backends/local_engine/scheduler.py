"""Continuous-batching scheduler of the local engine: one background thread drives the model.

Owns `Request` (one generation in flight) and `Scheduler`. Each loop step, under `model_lock`:
admit waiting requests up to `max_running` (one left-padded batched prefill over their distinct
prompts: requests with the same prompt share its row, `shared_prompts`; the caches join the
batch's KV cache: the preallocated `SlotKV` with its lean decode step for Qwen3-family models,
else the left-padded `BatchKV` and the HF forward; first tokens are sampled from the prefill
logits), then run ONE batched decode forward for all running requests, sample per request, and
retire finished requests at once (stop token ids incl. eos, stop strings on the decoded text,
max_new_tokens, context length) so their slots free for the next step (the last rows move into
the freed slots: `fill_holes`). `pause()` stops stepping (running requests wait, new ones
queue); `abort()` finishes requests with finish reason abort and what they generated so far.
Weight updates take `model_lock`, so they happen between steps.

A step that raises (a failed forward, out of memory) ends the loop for good: `failure` keeps the
cause, every request in flight (waiting, being admitted or running) ends with an error result
`{"error": {"message", "code": 500}}`, and later submissions end at once with code 503. The HTTP
layer answers those codes and reports the engine unhealthy; a supervisor (--use-fault-tolerance)
restarts the process. SGLang's server dies outright when its scheduler raises; both are 5xx or
unreachable to a client, and both fail the health check.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Callable

import torch

from slime.backends.local_engine.kv_batch import BatchKV
from slime.backends.local_engine.routed_experts import RoutedExpertsCapture, routed_experts_meta
from slime.backends.local_engine.sampling import SamplingParams, sample_next_tokens
from slime.backends.local_engine.slot_kv import SlotKV, supports_slot_kv

logger = logging.getLogger(__name__)


def fill_holes(keep: list[int]) -> list[int]:
    """The new row order after retiring: the kept rows (indices of the old batch, ascending) that
    are below the new batch size stay where they are, and the rows beyond it move into the freed
    slots. So only as many KV cache rows move as there are holes (rows are independent in a
    step, so their order changes no result)."""
    size = len(keep)
    movers = iter(i for i in keep if i >= size)
    kept = set(keep)
    return [i if i in kept else next(movers) for i in range(size)]


def shared_prompts(reqs: list[Request]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts of `reqs` in first-seen order, and for each request the index of its
    prompt; a request whose prompt came earlier has it counted as `cached_tokens`."""
    prompts: list[list[int]] = []
    index: dict[tuple[int, ...], int] = {}
    row_of = []
    for req in reqs:
        key = tuple(req.prompt_ids)
        if key in index:
            req.cached_tokens = len(key)
        else:
            index[key] = len(prompts)
            prompts.append(req.prompt_ids)
        row_of.append(index[key])
    return prompts, row_of


def error_result(message: str, code: int) -> dict:
    """The result handed to `Request.on_done` when a request cannot be served (HTTP status `code`)."""
    return {"error": {"message": message, "code": code}}


@dataclasses.dataclass
class Request:
    """One generation: inputs, validated params, progress, and the callback that receives the result."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    on_done: Callable[[dict], None]
    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    logprob_start_len: int = -1  # >= 0 with return_logprob: also report prompt token logprobs from there
    input_logprobs: list | None = None
    generator: torch.Generator | None = None
    output_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish_reason: dict | None = None
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    routed_experts: list = dataclasses.field(default_factory=list)  # [n, layers, k] int32 per forward
    cached_tokens: int = 0  # prompt tokens not computed for it (another request of its prefill had the same prompt)
    created: float = dataclasses.field(default_factory=time.monotonic)


class Scheduler:
    """Owns the waiting queue, the running batch and the background thread that steps the model."""

    def __init__(self, model, tokenizer, *, context_length: int, max_running: int, random_seed: int,
                 weight_version: Callable[[], str]) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.context_length, self.max_running = context_length, max_running
        self.weight_version = weight_version
        self.model_lock = threading.RLock()
        self._cond = threading.Condition()
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []
        self._kv = SlotKV() if supports_slot_kv(model) else BatchKV()  # preallocated + lean decode when exact
        self._paused = False
        self._held: set[str] = set()  # reasons the loop must not step (e.g. "released")
        self._stopped = False
        self._admitting: list[Request] = []  # popped from waiting, not yet running (prefill in progress)
        self.failure: str | None = None  # set once when a step raised; the loop has ended
        self._seed_source = torch.Generator().manual_seed(random_seed)
        self.routing = RoutedExpertsCapture(model)
        self.eos_ids = self._eos_ids()
        self._thread = threading.Thread(target=self._loop, name="local-engine-scheduler", daemon=True)

    def _eos_ids(self) -> set[int]:
        ids = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        return ids

    # ---- control (any thread) -------------------------------------------------------------
    def start(self) -> None:
        """Start the background loop."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop (running requests are aborted) and join the thread."""
        self.abort(abort_all=True)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def submit(self, req: Request) -> None:
        """Queue a request; `req.on_done(result)` is called from the scheduler thread when it ends."""
        if req.generator is None:
            seed = req.params.sampling_seed
            if seed is None:
                with self._cond:
                    seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
            req.generator = torch.Generator().manual_seed(seed)
        with self._cond:
            failure = self.failure
            if failure is None:
                self._waiting.append(req)
                self._cond.notify_all()
        if failure is not None:
            req.on_done(error_result(f"the engine is unhealthy (its scheduler failed: {failure})", 503))

    def pause(self) -> None:
        """Stop stepping after the current step: running requests wait, new requests queue."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        """Undo `pause()`."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def hold(self, reason: str, on: bool) -> None:
        """Add or remove a named reason for not stepping (used while memory is released)."""
        with self._cond:
            (self._held.add if on else self._held.discard)(reason)
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        """True while paused or held."""
        return self._paused or bool(self._held)

    def idle(self) -> bool:
        """SGLang's /flush_cache condition: nothing running and, unless generation is paused or
        held, nothing waiting. Takes `model_lock`, so a request being admitted counts as running."""
        with self.model_lock, self._cond:
            return not self._running and (self.paused or not self._waiting)

    def load(self) -> dict[str, int]:
        """Counts of waiting and running requests."""
        with self._cond:
            return {"waiting": len(self._waiting), "running": len(self._running)}

    def abort(self, rid: str | None = None, abort_all: bool = False) -> int:
        """Finish the matching waiting/running requests with finish reason abort; returns how many."""
        match = (lambda r: True) if abort_all else (lambda r: r.rid == rid)
        with self.model_lock:
            with self._cond:
                waiting = [r for r in self._waiting if match(r)]
                self._waiting = collections.deque(r for r in self._waiting if not match(r))
            running = [r for r in self._running if match(r)]
            for req in waiting + running:
                req.finish_reason = {"type": "abort", "message": "Abort request"}
            if running:
                self._retire()
            for req in waiting:
                self._deliver(req)
        return len(waiting) + len(running)

    def kv_cache_bytes(self) -> int:
        """Bytes the running batch's KV cache holds now. Read without the model lock (called from
        the HTTP event loop, which must not wait for a decode step or a weight update): a
        snapshot that may be one step old."""
        return self._kv.nbytes()

    def drop_cache(self) -> None:
        """Abort everything in flight and free the KV cache (memory release)."""
        self.abort(abort_all=True)
        with self.model_lock:
            self._kv.clear()

    # ---- the loop (scheduler thread) ------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (self.paused or not (self._waiting or self._running)):
                    self._cond.wait()
                if self._stopped:
                    return
            with self.model_lock, torch.inference_mode():
                try:
                    self._admit()
                    if self._running:
                        self._decode_step()
                except Exception as exc:  # engine health: a failed step must not hang its requests
                    logger.exception("local engine scheduler step failed; the engine is now unhealthy")
                    self._fail(f"{type(exc).__name__}: {exc}")
                    return

    def _fail(self, cause: str) -> None:
        """Record `cause`, end the loop's requests with an error (code 500) and refuse new ones."""
        with self._cond:
            self.failure = cause
            # a request can be in both lists when the prefill raised after it joined the batch
            doomed = list({id(r): r for r in [*self._waiting, *self._admitting, *self._running]}.values())
            self._waiting.clear()
            self._cond.notify_all()
        self._admitting, self._running = [], []
        self._kv.clear()
        for req in doomed:
            req.on_done(error_result(f"the engine's scheduler failed: {cause}", 500))

    def _admit(self) -> None:
        """Move waiting requests into the batch (up to max_running) with one batched prefill."""
        admitted = self._admitting = []
        with self._cond:
            while self._waiting and not self.paused and len(self._running) + len(admitted) < self.max_running:
                admitted.append(self._waiting.popleft())
        for req in admitted:
            if req.return_logprob and req.logprob_start_len >= 0:
                self._input_logprobs(req)
        for req in [r for r in admitted if r.params.max_new_tokens == 0]:
            req.finish_reason = {"type": "length", "length": 0}
            self._deliver(req)
        admitted = [r for r in admitted if r.params.max_new_tokens > 0]
        if admitted:
            self._admitting = admitted
            self._prefill(admitted)
            self._admitting = []

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _prefill(self, reqs: list[Request]) -> None:
        """One left-padded forward over the distinct prompts of `reqs` (requests with the same
        prompt, e.g. a group's samples, share its row, as SGLang's prefix cache would serve them);
        each request samples its first token from its prompt's logits, and those that go on join
        the batch with their own copy of the prompt's cache (one that ended at its first token
        never enters the cache)."""
        prompts, row_of = shared_prompts(reqs)
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self._device())
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self._device())
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        self.routing.arm(reqs)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        self.routing.collect(reqs, mask, row_of)
        rows = torch.tensor(row_of, device=self._device())
        self._sample(out.logits[:, -1].index_select(0, rows), reqs)
        going = [i for i, r in enumerate(reqs) if r.finish_reason is None]
        if going:
            keep = rows[going]
            cache = out.past_key_values
            self._kv.add_rows([layer.keys.index_select(0, keep) for layer in cache.layers],
                              [layer.values.index_select(0, keep) for layer in cache.layers], mask.index_select(0, keep))
            self._running.extend(reqs[i] for i in going)
        self._deliver_all([r for r in reqs if r.finish_reason is not None])

    def _input_logprobs(self, req: Request) -> None:
        """Prompt token logprobs from `logprob_start_len` on (SGLang's input_token_logprobs). As in
        SGLang 0.5.23 (`SchedulerLogprobResultProcessor._process_input_token_logprobs`), the entry
        at `logprob_start_len` itself carries None (only later positions are scored), whatever
        the start."""
        ids = torch.tensor([req.prompt_ids], device=self._device())
        logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        temperature = req.params.temperature if req.params.temperature > 0 else 1.0
        logp = torch.log_softmax(logits / temperature, dim=-1).gather(1, ids[0, 1:, None])[:, 0].tolist()
        entries = [[None, req.prompt_ids[0]]] + [[lp, tok] for lp, tok in zip(logp, req.prompt_ids[1:])]
        req.input_logprobs = [[None, entries[req.logprob_start_len][1]]] + entries[req.logprob_start_len + 1 :]

    def _decode_step(self) -> None:
        reqs = list(self._running)
        ids = torch.tensor([[r.output_ids[-1]] for r in reqs], device=self._device())
        self.routing.arm(reqs)
        logits = self._kv.decode_logits(self.model, ids)  # [B, V]; SlotKV's lean step or the HF forward
        self.routing.collect(reqs, torch.ones_like(ids))
        if self._sample(logits, reqs):
            self._retire()

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> bool:
        """Sample for `reqs` (rows of `logits` [B, V]) and append; True if any of them finished."""
        tokens, logprobs = sample_next_tokens(logits, [r.params for r in reqs], [r.generator for r in reqs])
        finished = False
        for req, tok, lp in zip(reqs, tokens, logprobs):
            req.output_ids.append(tok)
            req.logprobs.append(lp)
            req.finish_reason = self._finish_reason(req, tok)
            finished |= req.finish_reason is not None
        return finished

    def _finish_reason(self, req: Request, tok: int) -> dict | None:
        p = req.params
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_ids):
            return {"type": "stop", "matched": tok}
        if p.stop:
            text = self._decode(req)
            for s in p.stop:
                if s in text:
                    return {"type": "stop", "matched": s}
        if len(req.output_ids) >= p.max_new_tokens or len(req.prompt_ids) + len(req.output_ids) >= self.context_length:
            return {"type": "length", "length": len(req.output_ids)}
        return None

    def _retire(self) -> None:
        """Remove every running request that has a finish reason; deliver their results."""
        keep = fill_holes([i for i, r in enumerate(self._running) if r.finish_reason is None])
        done = [r for r in self._running if r.finish_reason is not None]
        self._kv.keep_rows(keep)
        self._running = [self._running[i] for i in keep]
        self._deliver_all(done)

    def _deliver_all(self, done: list[Request]) -> None:
        for req in done:
            self._deliver(req)
        with self._cond:
            self._cond.notify_all()

    # ---- results ---------------------------------------------------------------------------
    def _decode(self, req: Request) -> str:
        return self.tokenizer.decode(req.output_ids, skip_special_tokens=req.params.skip_special_tokens,
                                     spaces_between_special_tokens=req.params.spaces_between_special_tokens)

    def _deliver(self, req: Request) -> None:
        text = self._decode(req)
        matched = req.finish_reason.get("matched")
        if isinstance(matched, str) and not req.params.no_stop_trim and matched in text:
            text = text[: text.index(matched)]
        meta = {
            "id": req.rid,
            "finish_reason": req.finish_reason,
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "weight_version": self.weight_version(),
            "e2e_latency": time.monotonic() - req.created,
        }
        if req.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, tok, self.tokenizer.decode([tok]) if req.return_text_in_logprobs else None]
                for lp, tok in zip(req.logprobs, req.output_ids)
            ]
        if req.input_logprobs is not None:
            meta["input_token_logprobs"] = [
                [lp, tok, self.tokenizer.decode([tok]) if req.return_text_in_logprobs else None]
                for lp, tok in req.input_logprobs
            ]
        meta.update(routed_experts_meta(req))
        req.on_done({"text": text, "output_ids": list(req.output_ids), "meta_info": meta})
