"""The shared shape of every trainer -> engine weight sync.

Owns `WeightSender` (the base of the distributed / tensor / disk senders): one `update_weights`
call is collective over the trainer ranks and runs
  leader: pause_generation (mode "abort") + flush_cache (retried while the engine answers 400,
          i.e. while aborted requests drain) + begin_weight_update where the engine's release
          needs a session for this sender's endpoint, on every engine -> barrier ->
  every rank: iterate the HF buckets (collectives), sender ranks ship them -> barrier ->
  leader: finish (e.g. the disk POST) + end_weight_update (where begun) + continue_generation.
Which release needs what is `slime.utils.engine_protocol`'s table; each engine's protocol is read
once (its /server_info `version`) and kept for the sender's life.
Each update carries a weight version (given, or a counter "1", "2", ...) that the engines then
report in /model_info and meta_info.weight_version. Also owns `TrainerRole` (which rank
leads, which sends, how to barrier, which cluster-wide lock serialises the senders' transfers),
`StoreLock` (that lock, over the trainer's torch.distributed store) and `run_on_engines` (one
async call per engine, concurrent).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import uuid
from typing import Callable, ContextManager, Iterable

from slime.utils import engine_protocol
from slime.utils.engine_client import EngineClient

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainerRole:
    """This rank's part in a sync: `is_leader` (talks pause/continue), `is_sender` (ships its
    stage's buckets), `stage_tag` (unique per sending rank, e.g. "pp0"), `barrier`, and `lock`
    (a factory of the context manager that every sender of the cluster holds around one transfer
    that engines serve one at a time, see `UpdateWeightFromDistributed`)."""

    is_leader: bool = True
    is_sender: bool = True
    stage_tag: str = "pp0"
    barrier: Callable[[], None] = lambda: None
    lock: Callable[[], ContextManager] = contextlib.nullcontext


class StoreLock:
    """A mutex shared by every process that reaches `store` (a torch.distributed Store), under `key`.

    Acquired by an atomic compare-and-set of `key` from "" to a token unique to this holder, polled
    every `poll_s`; released by setting it back. Waiting longer than `timeout_s` raises, naming the
    holder (a sender that died holding it). Not re-entrant. Use as a context manager.
    """

    def __init__(self, store, key: str, owner: str, timeout_s: float = 600.0, poll_s: float = 0.02) -> None:
        self.store, self.key, self.timeout_s, self.poll_s = store, key, timeout_s, poll_s
        self.token = f"{owner}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> "StoreLock":
        deadline = time.monotonic() + self.timeout_s
        while True:
            holder = self.store.compare_set(self.key, "", self.token).decode()
            if holder == self.token:
                return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {self.timeout_s:.0f}s for the weight-sync lock {self.key!r}, "
                                   f"held by {holder!r}")
            time.sleep(self.poll_s)

    def __exit__(self, *exc) -> None:
        self.store.compare_set(self.key, self.token, "")


WEIGHT_SYNC_LOCK_KEY = "slime/weight_sync_lock"


def megatron_role() -> TrainerRole:
    """`TrainerRole` of this megatron rank: global rank 0 leads, `is_weight_sender()` ranks send,
    and the senders of every pipeline stage share one `StoreLock` on the default group's store
    (the rendezvous store every trainer rank already reaches)."""
    import functools

    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from slime.backends.megatron_utils import collectives
    from slime.backends.megatron_utils.weight_export import is_weight_sender

    stage_tag = f"pp{mpu.get_pipeline_model_parallel_rank()}"
    store = dist.distributed_c10d._get_default_store()
    return TrainerRole(is_leader=dist.get_rank() == 0, is_sender=is_weight_sender(), stage_tag=stage_tag,
                       barrier=collectives.barrier,
                       lock=functools.partial(StoreLock, store, WEIGHT_SYNC_LOCK_KEY, stage_tag))


def run_on_engines(urls: list[str], call: Callable, timeout: float = 600.0) -> list:
    """Run `await call(client, index)` for every engine concurrently (fresh loop); returns results.

    Blocks the calling thread; the first failure is raised after all calls finished.
    """
    async def main():
        clients = [EngineClient(url, timeout=timeout) for url in urls]
        try:
            results = await asyncio.gather(*(call(c, i) for i, c in enumerate(clients)), return_exceptions=True)
        finally:
            await asyncio.gather(*(c.close() for c in clients))
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    return asyncio.run(main())


class WeightSender:
    """Base of the senders. `buckets()` yields lists of `(hf_name, tensor)` (collective over the
    trainer ranks: every rank iterates it); subclasses implement `send_bucket` (sender ranks) and
    may override `connect`, `disconnect`, `before_send` and `after_send` (leader only).
    `ENDPOINT` names the engine endpoint the buckets go through (it decides the session)."""

    ENDPOINT = ""

    def __init__(self, engine_urls: list[str], buckets: Callable[[], Iterable[list]],
                 role: TrainerRole = TrainerRole(), timeout: float = 600.0) -> None:
        if not engine_urls:
            raise ValueError("weight sync needs at least one engine URL")
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.buckets, self.role, self.timeout = buckets, role, timeout
        self.updates = 0
        self._protocols: dict[str, engine_protocol.Protocol] = {}

    def on_engines(self, call: Callable) -> list:
        """`run_on_engines` over this sender's engines."""
        return run_on_engines(self.engine_urls, call, self.timeout)

    def protocols(self) -> list[engine_protocol.Protocol]:
        """Each engine's `engine_protocol.Protocol` (read from its /server_info on first use)."""
        missing = [url for url in self.engine_urls if url not in self._protocols]
        if missing:
            found = run_on_engines(missing, lambda c, _i: engine_protocol.read_protocol(c), self.timeout)
            self._protocols.update(zip(missing, found))
        return [self._protocols[url] for url in self.engine_urls]

    def _session_protocols(self) -> list[engine_protocol.Protocol | None]:
        """Per engine, its protocol when an update through this sender's endpoint needs a session
        there, else None (disk updates never look: their engines' versions need not be read)."""
        if not any(p.needs_session(self.ENDPOINT) for p in engine_protocol.PROTOCOLS.values()):
            return [None] * len(self.engine_urls)
        return [p if p.needs_session(self.ENDPOINT) else None for p in self.protocols()]

    def _quiesce(self) -> None:
        """Per engine, in one exchange: pause (aborting what is in flight), wait until idle
        (/flush_cache), open the session its protocol needs."""
        protocols = self._session_protocols()

        async def quiesce(client, i):
            await client.pause_generation(mode="abort")
            await client.flush_cache()
            if protocols[i] is not None:
                await engine_protocol.begin_weights(client, protocols[i], self.ENDPOINT)

        self.on_engines(quiesce)

    def _close_sessions(self) -> None:
        protocols = self._session_protocols()
        if any(p is not None for p in protocols):
            self.on_engines(lambda c, i: engine_protocol.end_weights(c, protocols[i], self.ENDPOINT))

    def _resume(self) -> None:
        """Per engine, in one exchange: close the session, continue generating."""
        protocols = self._session_protocols()

        async def resume(client, i):
            if protocols[i] is not None:
                await engine_protocol.end_weights(client, protocols[i], self.ENDPOINT)
            await client.continue_generation()

        self.on_engines(resume)

    def connect(self) -> None:
        """Prepare the transport (collective); a no-op unless a subclass needs a group."""

    def disconnect(self) -> None:
        """Tear the transport down (collective); a no-op unless a subclass needs a group."""

    def before_send(self, version: str) -> None:
        """Leader only, engines paused, before any bucket is sent."""

    def after_send(self, version: str) -> None:
        """Leader only, after every sender finished, before generation continues."""

    def send_bucket(self, bucket: list, version: str) -> None:
        """Ship one bucket of `(hf_name, tensor)` to every engine (sender ranks only)."""
        raise NotImplementedError

    def update_weights(self, weight_version: str | int | None = None) -> str:
        """Sync the trainer's weights into every engine; collective. Returns the version set.

        A failure (e.g. an engine rejecting a bucket: `EngineHTTPError`) propagates and leaves the
        engines paused, so nothing generates with a partial update; a session the leader opened
        is closed first (best effort), so a later update can open its own."""
        self.updates += 1
        version = str(self.updates if weight_version is None else weight_version)
        try:
            if self.role.is_leader:
                self._quiesce()
            count = self._send_all(version)
        except BaseException:
            if self.role.is_leader:
                self._close_sessions_after_failure()
            raise
        if self.role.is_leader:
            self._resume()
        logger.info("weight version %s: %s sent %d tensors to %d engine(s)", version,
                    self.role.stage_tag, count, len(self.engine_urls))
        return version

    def _send_all(self, version: str) -> int:
        """before_send (leader), every bucket (sender ranks), after_send (leader); returns the
        tensors this rank sent."""
        if self.role.is_leader:
            self.before_send(version)
        self.role.barrier()
        count = 0
        for bucket in self.buckets():
            if self.role.is_sender:
                self.send_bucket(bucket, version)
                count += len(bucket)
        self.role.barrier()
        if self.role.is_leader:
            self.after_send(version)
        return count

    def _close_sessions_after_failure(self) -> None:
        try:
            self._close_sessions()
        except Exception as exc:  # the update's own error is the one to raise
            logger.warning("closing the weight-update sessions after a failed update failed too: %s", exc)
