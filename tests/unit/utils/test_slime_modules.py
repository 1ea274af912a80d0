"""Modules plugins import at slime's paths: mask_utils, http_utils, processing_utils,
misc.SingletonMeta and async_utils.run."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import pytest

from slime.utils import http_utils
from slime.utils.async_utils import run
from slime.utils.loss_mask import tokens_and_loss_mask
from slime.utils.mask_utils import MultiTurnLossMaskGenerator
from slime.utils.misc import SingletonMeta, free_port
from slime.utils.processing_utils import load_processor, load_tokenizer

CONVERSATION = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"},
                {"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]


def test_multi_turn_loss_mask_generator_is_the_chat_template_mask(tiny_dense_hf):
    tokenizer = load_tokenizer(str(tiny_dense_hf))
    gen = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="qwen")
    tokens, mask = gen.get_loss_mask(CONVERSATION)
    assert (tokens, mask) == tokens_and_loss_mask(tokenizer, CONVERSATION, "qwen")
    assert len(tokens) == len(mask) and "4" in tokenizer.decode([t for t, m in zip(tokens, mask) if m])
    assert gen.get_response_lengths([[0, 0, 1, 0, 1]]) == [3]
    with pytest.raises(ValueError, match="tokenizer_type 'llama'"):
        MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="llama")


def test_load_processor_is_none_for_a_text_model(tiny_dense_hf, tmp_path):
    assert load_processor(str(tiny_dense_hf)) is None
    with pytest.raises(OSError):
        load_processor(str(tmp_path / "missing"))


class _Echo(BaseHTTPRequestHandler):
    def _answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out = json.dumps({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                          "body": json.loads(body) if body else None}).encode()
        self.send_response(500 if self.path == "/fail" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = _answer  # noqa: N815 - http.server naming

    def log_message(self, *args):
        pass


@pytest.fixture
def echo():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_post_and_get_send_the_job_key(echo, monkeypatch):
    from slime.utils.engine_client import EngineHTTPError

    monkeypatch.setenv("SLIME_API_KEY", "k-123")
    got = asyncio.run(http_utils.post(f"{echo}/generate", {"text": "hi"}))
    assert got == {"method": "POST", "path": "/generate", "auth": "Bearer k-123", "body": {"text": "hi"}}
    assert asyncio.run(http_utils.post(f"{echo}/x", {"a": 1}, action="put"))["method"] == "PUT"
    assert run(http_utils.get(f"{echo}/health"))["method"] == "GET"
    with pytest.raises(EngineHTTPError):  # an HTTP error status is not retried
        asyncio.run(http_utils.post(f"{echo}/fail", {}))


def test_unreachable_server_is_retried_then_raised(monkeypatch, caplog):
    monkeypatch.setattr(http_utils, "RETRY_INTERVAL_S", 0.0)
    with pytest.raises(aiohttp.ClientConnectionError):
        asyncio.run(http_utils.get(f"http://127.0.0.1:{free_port()}/health", max_retries=2))
    assert sum("retry" in r.getMessage() for r in caplog.records) == 2


def test_singleton_meta_and_async_run():
    class One(metaclass=SingletonMeta):
        def __init__(self, value):
            self.value = value

    try:
        assert One(1) is One(2) and One(3).value == 1
    finally:
        SingletonMeta.clear(One)
    assert One(4).value == 4
    SingletonMeta.clear(One)

    async def add(a, b):
        await asyncio.sleep(0)
        return a + b

    async def inside_a_loop():
        return run(add(2, 3))  # blocks this loop's thread; the coroutine runs on the shared loop

    assert run(add(1, 2)) == 3 and asyncio.run(inside_a_loop()) == 5
    with pytest.raises(ZeroDivisionError):
        run(_raise())


async def _raise():
    return 1 / 0
