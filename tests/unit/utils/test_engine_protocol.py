"""The per-release protocol table and the memory release sequence (against a small aiohttp server
that records what it is asked): a release waits for /flush_cache to answer 200 first."""

import asyncio

import pytest
from aiohttp import web

from slime.utils import engine_protocol
from slime.utils.engine_client import EngineClient


def test_each_supported_release_has_its_protocol():
    assert engine_protocol.protocol_for("0.5.23").needs_session("update_weights_from_tensor")
    assert engine_protocol.protocol_for("0.5.23").needs_session("/update_weights_from_distributed")
    assert not engine_protocol.protocol_for("0.5.23").needs_session("update_weights_from_disk")
    assert not engine_protocol.protocol_for("0.5.15.post1").needs_session("update_weights_from_tensor")
    assert engine_protocol.NEWEST_RELEASE in engine_protocol.PROTOCOLS


def test_unlisted_releases_take_the_older_neighbours_protocol_and_older_ones_are_refused():
    assert engine_protocol.protocol_for("0.5.20").release == "0.5.15.post1"
    assert engine_protocol.protocol_for("0.6.1").release == "0.5.23"
    for bad in ("0.4.9", None, "", "not-a-version"):
        with pytest.raises(ValueError):
            engine_protocol.protocol_for(bad)


async def _recording_server(flush_answers: list[int]):
    """A server recording (method, path) of every request; /flush_cache answers `flush_answers`
    in turn (the last repeats), everything else 200, /server_info version 0.5.23."""
    calls: list[str] = []

    async def handle(request):
        calls.append(request.path)
        if request.path == "/flush_cache":
            flushes = calls.count("/flush_cache")
            return web.Response(status=flush_answers[min(flushes, len(flush_answers)) - 1], text="")
        if request.path == "/server_info":
            return web.json_response({"version": "0.5.23"})
        return web.json_response({"success": True, "message": "Success"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", calls


def test_release_waits_until_the_engine_flushed():
    async def main():
        runner, url, calls = await _recording_server([400, 400, 200])
        try:
            async with EngineClient(url) as client:
                protocol = await engine_protocol.read_protocol(client)
                await engine_protocol.release_memory(client, ["kv_cache"])
                await engine_protocol.resume_memory(client, ["kv_cache"])
        finally:
            await runner.cleanup()
        return protocol, calls

    protocol, calls = asyncio.run(main())
    assert protocol.release == "0.5.23"
    assert calls == ["/server_info", "/flush_cache", "/flush_cache", "/flush_cache", "/release_memory_occupation",
                     "/resume_memory_occupation"]
