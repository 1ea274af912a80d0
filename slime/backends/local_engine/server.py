"""HTTP surface of the local engine: SGLang's endpoints and fields on FastAPI.

Owns `build_app(engine)`. Routes live in one table (path, methods, handler). Bodies, defaults
and status codes follow SGLang's http_server and `managers/io_struct.py` (e.g. pause's mode
defaults to "abort", group names to "weight_update_group", `/flush_cache` answers 400 while
requests are in flight). Client errors (malformed JSON, bad values) raise `RequestError` and
become HTTP 400 `{"error": {"message"}, "success": false, "message"}`; the engine keeps serving.
Blocking work (weight updates, group rendezvous, memory release) runs in worker threads so
/health stays responsive. Access rules (the API key, the weight folders and rendezvous hosts
allowed) come from a `guard.Guard`: requests without the key get 401 before any route runs.
"""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response

from slime.backends.local_engine.engine import Engine
from slime.backends.local_engine.guard import Guard, add_auth_middleware
from slime.backends.local_engine.sampling import RequestError

logger = logging.getLogger(__name__)


async def _json(request: HTTPRequest) -> dict:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _require(body: dict, *names: str) -> list:
    missing = [n for n in names if body.get(n) is None]
    if missing:
        raise RequestError(f"missing field(s): {', '.join(missing)}")
    return [body[n] for n in names]


def _resolve(fut: asyncio.Future, result: dict) -> None:
    if not fut.done():
        fut.set_result(result)


def _resolver(loop: asyncio.AbstractEventLoop, fut: asyncio.Future):
    """Callback for the scheduler thread that hands `result` to `fut` on its event loop."""

    def deliver(result: dict) -> None:
        if not loop.is_closed():  # at shutdown the loop may be gone before aborted requests finish
            loop.call_soon_threadsafe(_resolve, fut, result)

    return deliver


def _server_error(message: str, status: int) -> JSONResponse:
    """An engine-side failure, in the same body shape as a client error."""
    return JSONResponse({"error": {"message": message}, "success": False, "message": message}, status_code=status)


def _ok(message: str, **extra) -> JSONResponse:
    return JSONResponse({"success": True, "message": message, **extra})


# SGLang's default group name (io_struct's *WeightsUpdateGroupReqInput and
# UpdateWeightsFromDistributedReqInput) and group backend.
DEFAULT_GROUP = "weight_update_group"
DEFAULT_GROUP_BACKEND = "nccl"


async def _abort_if_asked(engine: Engine, body: dict) -> None:
    """SGLang's `abort_all_requests` field of the weight-update requests (default False)."""
    if body.get("abort_all_requests"):
        await asyncio.to_thread(engine.scheduler.abort, None, True)


def _generation_routes(engine: Engine) -> list:
    async def generate(request: HTTPRequest):
        body = await _json(request)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future] = []

        def on_done_factory(_index):
            fut = loop.create_future()
            futures.append(fut)
            return _resolver(loop, fut)

        reqs, batch = engine.parse_generate(body, on_done_factory)
        for req in reqs:
            engine.scheduler.submit(req)
        try:
            results = await asyncio.gather(*futures)
        except asyncio.CancelledError:  # client went away: free the slots
            for req in reqs:
                engine.scheduler.abort(rid=req.rid)
            raise
        failed = next((r for r in results if "error" in r), None)
        if failed is not None:  # the scheduler failed (500) or had failed before (503)
            return _server_error(failed["error"]["message"], failed["error"]["code"])
        return JSONResponse(results if batch else results[0])

    async def health(_request: HTTPRequest):
        if engine.scheduler.failure is not None:  # SGLang answers 503 when unhealthy
            return _server_error(f"unhealthy: {engine.scheduler.failure}", 503)
        return JSONResponse({"status": "ok"})

    async def health_generate(_request: HTTPRequest):
        if engine.scheduler.failure is not None:
            return _server_error(f"unhealthy: {engine.scheduler.failure}", 503)
        if engine.scheduler.paused:  # generation is held on purpose; the engine itself is alive
            return JSONResponse({"status": "ok", "paused": True})
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        reqs, _ = engine.parse_generate({"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
                                        lambda _i: _resolver(loop, fut))
        engine.scheduler.submit(reqs[0])
        result = await fut
        if "error" in result:
            return _server_error(result["error"]["message"], 503)
        return JSONResponse({"status": "ok"})

    return [("/generate", ["POST"], generate), ("/health", ["GET"], health),
            ("/health_generate", ["GET"], health_generate)]


def _control_routes(engine: Engine) -> list:
    async def flush_cache(request: HTTPRequest):
        # SGLang's semantics: 200 only when the scheduler is idle (nothing running; nothing waiting
        # unless generation is paused), else 400 - at once, or after waiting up to ?timeout= seconds.
        # There is no prefix cache here, so an idle flush has nothing else to do.
        try:
            timeout = float(request.query_params.get("timeout") or 0.0)
        except ValueError as exc:
            raise RequestError(f"timeout must be a number: {exc}") from exc
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while not (idle := await asyncio.to_thread(engine.scheduler.idle)) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        load = engine.scheduler.load()
        if not idle:
            return Response(f"Cache not flushed because there are pending requests. #queue-req: "
                            f"{load['waiting']}, #running-req: {load['running']}\n", status_code=400)
        return Response("Cache flushed.\n", status_code=200)

    async def pause_generation(request: HTTPRequest):
        # SGLang modes: "in_place" keeps running requests (with their KV) waiting; "retract" does the
        # same here (no KV pressure to relieve); "abort" also finishes everything in flight as abort.
        mode = (await _json(request)).get("mode") or "abort"  # PauseGenerationReqInput's default
        if mode not in ("in_place", "retract", "abort"):
            raise RequestError(f"mode must be one of in_place, retract, abort; got {mode!r}")
        engine.scheduler.pause()
        if mode == "abort":
            await asyncio.to_thread(engine.scheduler.abort, None, True)
        return _ok(f"Generation paused ({mode}).")

    async def continue_generation(_request: HTTPRequest):
        engine.scheduler.resume()
        return _ok("Generation continued.")

    async def abort_request(request: HTTPRequest):
        body = await _json(request)  # AbortReq: rid defaults to "" (matches nothing), abort_all to False
        count = await asyncio.to_thread(engine.scheduler.abort, body.get("rid"), bool(body.get("abort_all")))
        return _ok(f"aborted {count} request(s)", aborted=count)

    return [
        ("/flush_cache", ["GET", "POST"], flush_cache),
        ("/pause_generation", ["POST"], pause_generation), ("/continue_generation", ["POST"], continue_generation),
        ("/abort_request", ["POST"], abort_request),
    ]


def _info_routes(engine: Engine) -> list:
    async def get_model_info(_request: HTTPRequest):
        return JSONResponse(engine.model_info())

    async def get_server_info(_request: HTTPRequest):
        return JSONResponse(engine.server_info())

    # SGLang serves both names (the get_ ones deprecated); it has no /get_weight_version: the
    # version is in the model info.
    return [
        ("/model_info", ["GET"], get_model_info), ("/get_model_info", ["GET"], get_model_info),
        ("/server_info", ["GET"], get_server_info), ("/get_server_info", ["GET"], get_server_info),
    ]


def _weight_routes(engine: Engine, guard: Guard) -> list:
    w = engine.weights

    async def from_disk(request: HTTPRequest):
        body = await _json(request)
        (path,) = _require(body, "model_path")
        guard.check_weight_path(path)
        await _abort_if_asked(engine, body)
        n = await asyncio.to_thread(w.update_from_disk, path, body.get("load_format"), body.get("weight_version"))
        return _ok(f"loaded {n} tensors from {path}", weight_version=w.version)

    async def init_group(request: HTTPRequest):
        body = await _json(request)
        args = _require(body, "master_address", "master_port", "rank_offset", "world_size")
        guard.check_group_host(args[0])
        name = body.get("group_name", DEFAULT_GROUP)
        await asyncio.to_thread(w.init_group, *args, name, body.get("backend", DEFAULT_GROUP_BACKEND))
        return _ok(f"joined weights update group {name}")

    async def from_distributed(request: HTTPRequest):
        body = await _json(request)
        args = _require(body, "names", "dtypes", "shapes")
        await _abort_if_asked(engine, body)
        n = await asyncio.to_thread(w.update_from_distributed, *args, body.get("group_name", DEFAULT_GROUP),
                                    body.get("weight_version"), body.get("load_format"))
        return _ok(f"received {n} tensors", weight_version=w.version)

    async def destroy_group(request: HTTPRequest):
        body = await _json(request)
        name = body.get("group_name", DEFAULT_GROUP)
        await asyncio.to_thread(w.destroy_group, name)
        return _ok(f"destroyed weights update group {name}")

    async def from_tensor(request: HTTPRequest):
        body = await _json(request)
        (tensors,) = _require(body, "serialized_named_tensors")
        await _abort_if_asked(engine, body)
        n = await asyncio.to_thread(w.update_from_tensor, tensors, body.get("load_format"), body.get("weight_version"))
        return _ok(f"loaded {n} tensors", weight_version=w.version)

    return [
        ("/update_weights_from_disk", ["POST"], from_disk), ("/init_weights_update_group", ["POST"], init_group),
        ("/update_weights_from_distributed", ["POST"], from_distributed),
        ("/destroy_weights_update_group", ["POST"], destroy_group),
        ("/update_weights_from_tensor", ["POST"], from_tensor),
    ]


def _session_and_memory_routes(engine: Engine) -> list:
    w = engine.weights

    async def begin(_request: HTTPRequest):
        w.begin_session()
        return _ok("Success")

    async def end(_request: HTTPRequest):
        w.end_session()
        return _ok("Success")

    async def release(request: HTTPRequest):
        body = await _json(request)
        await asyncio.to_thread(w.release, body.get("tags"))
        return _ok("memory released")

    async def resume(request: HTTPRequest):
        body = await _json(request)
        await asyncio.to_thread(w.resume, body.get("tags"))
        return _ok("memory resumed")

    return [
        ("/begin_weight_update", ["POST"], begin), ("/end_weight_update", ["POST"], end),
        ("/release_memory_occupation", ["POST"], release), ("/resume_memory_occupation", ["POST"], resume),
    ]


async def _client_error(_request: HTTPRequest, exc: RequestError) -> JSONResponse:
    message = str(exc)
    return JSONResponse({"error": {"message": message}, "success": False, "message": message}, status_code=400)


def build_app(engine: Engine, guard: Guard | None = None) -> FastAPI:
    """A FastAPI app serving `engine` under `guard`'s rules (default: none; the caller
    starts/stops the engine's scheduler)."""
    guard = guard or Guard()
    app = FastAPI(title="slime local engine")
    routes = (_generation_routes(engine) + _control_routes(engine) + _info_routes(engine) + _weight_routes(engine, guard)
              + _session_and_memory_routes(engine))
    for path, methods, handler in routes:
        app.add_api_route(path, handler, methods=methods)
    app.add_exception_handler(RequestError, _client_error)
    add_auth_middleware(app, guard)
    return app
