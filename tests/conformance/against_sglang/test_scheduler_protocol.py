"""SGLang's own scheduler code judges the control requests we send in a weight sync and a memory
release/resume cycle.

Our real sender classes and engine actor methods run against a small recording HTTP server that
says it is this release (/server_info `version`); every request they make is recorded in order.
Each recorded control request is then converted to this release's `io_struct` class, the way its
HTTP server does (pydantic), and handed to this release's `SchedulerWeightUpdaterManager`
(`managers/scheduler_components/weight_updater.py`: weight updates, update sessions, memory
release/resume), built on CPU with a fake tp worker and model runner. Every call must succeed,
in order. Requests the HTTP layer handles (pause, continue, flush) only move the fake scheduler's
state: it counts as idle once a /flush_cache succeeded since generation last ran, since SGLang's
flush succeeds only then (the recorder answers the first /flush_cache of each busy period 400).

Sequences: colocated sync (release all -> resume weights -> tensor update -> resume the rest, in
`slime.ray.job`'s order), distributed sync, and a release/resume cycle. Seen 2026-11-25: on
main at 460894a (no begin/end session, release without flush) the 0.5.23 checks fail on the first
tensor / distributed update and both releases fail on the release (scheduler not idle).
"""

from __future__ import annotations

import asyncio
import json
import threading
import types

import pydantic
import pytest
import torch
from aiohttp import web

from slime.backends.megatron_utils.update_weight import UpdateWeightFromDistributed, UpdateWeightFromTensor
from slime.ray.engines import RolloutEngine
from slime.ray.job import ENGINE_TAGS

# endpoint -> (io_struct class, SchedulerWeightUpdaterManager method)
SCHEDULER_CALLS = {
    "/begin_weight_update": ("BeginWeightUpdateReqInput", "begin_weight_update"),
    "/end_weight_update": ("EndWeightUpdateReqInput", "end_weight_update"),
    "/update_weights_from_tensor": ("UpdateWeightsFromTensorReqInput", "update_weights_from_tensor"),
    "/update_weights_from_distributed": ("UpdateWeightsFromDistributedReqInput", "update_weights_from_distributed"),
    "/release_memory_occupation": ("ReleaseMemoryOccupationReqInput", "release_memory_occupation"),
    "/resume_memory_occupation": ("ResumeMemoryOccupationReqInput", "resume_memory_occupation"),
}
INFO_PATHS = ("/server_info", "/get_server_info")


class RecordingEngine:
    """An HTTP server in its own thread that records (path, JSON body, status) of every request.
    /server_info says `version`; /flush_cache answers 400 once per busy period (after start and
    after each /continue_generation), then 200; everything else 200 `success: true`."""

    def __init__(self, version: str) -> None:
        self.version, self.calls, self._busy = version, [], True
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(30)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, request):
        raw = await request.read()
        body = json.loads(raw) if raw.strip() else {}
        status = 200
        if request.path == "/flush_cache":
            status, self._busy = (400, False) if self._busy else (200, False)
        elif request.path == "/continue_generation":
            self._busy = True
        self.calls.append((request.path, body, status))
        if request.path in INFO_PATHS:
            return web.json_response({"version": self.version, "tp_size": 1})
        if status != 200:
            return web.Response(status=status, text="Cache not flushed because there are pending requests.")
        return web.json_response({"success": True, "message": "Success"})

    def take(self) -> list:
        calls, self.calls = self.calls, []
        return calls

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


class _NoTransport:
    """The distributed sender's group with the broadcasts left out (the control requests are under test)."""

    device = "cpu"

    def broadcast(self, tensor, src=0):
        pass


def _buckets():
    return [[("model.layers.0.self_attn.q_proj.weight", torch.randn(4, 4))], [("model.norm.weight", torch.ones(4))]]


def _engine_actor(url: str) -> RolloutEngine:
    """The engine actor's own release/resume methods, on the recording server (no process, no Ray)."""
    engine = RolloutEngine.__new__(RolloutEngine)
    engine._url = url
    return engine


def colocated_sync(url: str) -> None:
    """slime.ray.job's colocated order: engines release everything, get their weights back, the
    tensor sender syncs, then the KV cache and CUDA graphs come back."""
    engine = _engine_actor(url)
    engine.release_memory(list(ENGINE_TAGS))
    engine.resume_memory(["weights"])
    sender = UpdateWeightFromTensor([url], _buckets, gpus_per_engine=1)
    sender.connect()
    sender.update_weights("1")
    engine.resume_memory([t for t in ENGINE_TAGS if t != "weights"])


def distributed_sync(url: str) -> None:
    sender = UpdateWeightFromDistributed([url], _buckets, backend="gloo", master_address="127.0.0.1")
    sender.group = _NoTransport()
    sender.update_weights("2")


def release_resume_cycle(url: str) -> None:
    engine = _engine_actor(url)
    engine.release_memory(list(ENGINE_TAGS))
    engine.resume_memory(list(ENGINE_TAGS))


# ---- this release's scheduler side, on CPU -----------------------------------------------------
class FakeWeightUpdater:
    """The model runner's weight updater (0.5.23 calls it per runner)."""

    def __init__(self, log):
        self.log = log

    def begin_weight_update(self):
        self.log.append("runner.begin")

    def end_weight_update(self, run_post_load):
        self.log.append(f"runner.end(post_load={run_post_load})")

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        self.log.append(f"runner.tensor({load_format})")
        return True, "Success"

    def receive_weights_from_distributed(self, names, dtypes, shapes, group_name, load_format=None):
        self.log.append(f"runner.receive({len(names)})")
        return list(zip(names, shapes))

    def load_weights_from_distributed(self, weights):
        return True, "Succeeded to update parameter online."


class FakeTpWorker:
    """Both releases' tp worker surface the manager uses, over a tiny CPU model."""

    def __init__(self, log):
        self.log = log
        self.model_runner = types.SimpleNamespace(model=torch.nn.Linear(2, 2), weight_updater=FakeWeightUpdater(log))

    def weight_update_runners(self):  # 0.5.23
        return [("target", self.model_runner)]

    def deserialize_own_rank(self, serialized_named_tensors):  # 0.5.23 (payload bytes: test_colocated_payload)
        return serialized_named_tensors[0]

    def update_weights_from_tensor(self, recv_req):  # 0.5.15.post1
        self.log.append(f"worker.tensor({recv_req.load_format})")
        return True, "Success"

    def update_weights_from_distributed(self, recv_req):  # 0.5.15.post1
        self.log.append(f"worker.distributed({len(recv_req.names)})")
        return True, "Succeeded to update parameter online."


class FakeMemorySaver:
    def __init__(self, log):
        self.log = log

    def pause(self, tag):
        self.log.append(f"pause {tag}")

    def resume(self, tag):
        self.log.append(f"resume {tag}")


class SchedulerState:
    """What the HTTP layer's requests change: paused, idle (a flush succeeded since generation ran)."""

    def __init__(self):
        self._engine_paused, self.idle, self.versions = False, False, []
        from sglang.srt.disaggregation.utils import DisaggregationMode

        self.disaggregation_mode = DisaggregationMode.NULL

    def record_weight_version_change(self, new_version):
        self.versions.append(new_version)

    def is_fully_idle(self, ignore_waiting=False):
        return self.idle

    def flush_cache(self, empty_cache=False):
        return self.idle


@pytest.fixture
def trainer_reductions():
    """torch's own tensor reductions while our sender runs: another check of this process may have
    applied SGLang's `monkey_patch_torch_reductions` (engine-side; 0.5.15.post1's then breaks CPU
    tensors), which a trainer process never does. Put back afterwards."""
    from torch.multiprocessing import reductions

    original = getattr(reductions, "_reduce_tensor_original", None)
    patched = reductions.reduce_tensor
    if original is not None:
        reductions.reduce_tensor = original
        reductions.init_reductions()
    yield
    if original is not None:
        reductions.reduce_tensor = patched
        reductions.init_reductions()


@pytest.fixture(scope="module")
def cpu_group():
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def build_manager(cpu_group, monkeypatch, log):
    """This release's SchedulerWeightUpdaterManager with CPU fakes around it."""
    from sglang.srt.managers.scheduler_components import weight_updater

    state = SchedulerState()
    common = dict(tp_worker=FakeTpWorker(log), draft_worker=None, memory_saver_adapter=FakeMemorySaver(log),
                  flush_cache=state.flush_cache, is_fully_idle=state.is_fully_idle, scheduler=state)
    fields = weight_updater.SchedulerWeightUpdaterManager.__dataclass_fields__
    if "tp_cpu_group" in fields and fields["tp_cpu_group"].init:  # 0.5.15.post1: given
        return weight_updater.SchedulerWeightUpdaterManager(tp_cpu_group=cpu_group, **common), state
    # 0.5.23: read from the runtime context
    monkeypatch.setattr(weight_updater, "get_parallel", lambda: types.SimpleNamespace(
        tp_group=types.SimpleNamespace(cpu_group=cpu_group), tp_rank=0))
    monkeypatch.setattr(weight_updater, "get_model", lambda: types.SimpleNamespace(weight_cache_mode="off"))
    return weight_updater.SchedulerWeightUpdaterManager(**common), state


def request_object(path: str, body: dict):
    """What this release's HTTP server makes of `body` at `path` (pydantic into the io_struct class)."""
    from sglang.srt.managers import io_struct

    name, _method = SCHEDULER_CALLS[path]
    cls = getattr(io_struct, name, None)
    assert cls is not None, f"this sglang release has no {name}: it serves no {path}"
    return pydantic.TypeAdapter(cls).validate_python(json.loads(json.dumps(body)))


def replay(calls: list, manager, state) -> list[str]:
    """Hand each recorded request to the scheduler side; returns the paths replayed. Fails at the
    first call SGLang refuses (an output with success False, or an assertion/error it raises)."""
    done = []
    for path, body, status in calls:
        if path in INFO_PATHS:
            continue
        if path == "/pause_generation":
            state._engine_paused = True
        elif path == "/continue_generation":
            state._engine_paused, state.idle = False, False
        elif path == "/flush_cache":
            state.idle = state.idle or status == 200
        elif path in SCHEDULER_CALLS:
            out = getattr(manager, SCHEDULER_CALLS[path][1])(request_object(path, body))
            success = getattr(out, "success", True)
            assert success, f"SGLang refused {path} after {done}: {out.message}"
        else:
            raise AssertionError(f"unexpected request {path}")
        done.append(path)
    return done


@pytest.mark.parametrize("sequence", [colocated_sync, distributed_sync, release_resume_cycle])
def test_sglang_scheduler_accepts_our_control_sequence(sequence, sglang_version, cpu_group, monkeypatch,
                                                       trainer_reductions):
    from slime.utils.engine_protocol import protocol_for

    engine = RecordingEngine(sglang_version)
    try:
        sequence(engine.url)
        calls = engine.take()
    finally:
        engine.close()
    log: list[str] = []
    manager, state = build_manager(cpu_group, monkeypatch, log)
    done = replay(calls, manager, state)
    updates = [p for p in done if p.startswith("/update_weights_from_")]
    assert updates or sequence is release_resume_cycle
    if protocol_for(sglang_version).session_endpoints and updates:
        assert done.index("/begin_weight_update") < done.index(updates[0])
        assert done.index("/end_weight_update") > done.index(updates[-1])
        assert "runner.begin" in log and "runner.end(post_load=False)" in log
    if "/release_memory_occupation" in done:
        assert not manager.offload_tags, "every released tag was resumed"
