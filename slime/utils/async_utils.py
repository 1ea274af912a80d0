"""slime's `async_utils.run`: run a coroutine to completion from synchronous code.

The coroutines run on one event loop in a background thread (`AsyncLoopThread`, created on first
use), so async clients that keep a session across calls work, and `run` may be called from a
thread that already runs an event loop (it blocks that thread until the result is there).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine

from slime.utils.misc import SingletonMeta


class AsyncLoopThread(metaclass=SingletonMeta):
    """One event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="slime-async-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        """The coroutine's result (its exception is raised here; `TimeoutError` after `timeout`
        seconds, the coroutine going on)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def run(coro: Coroutine, timeout: float | None = None) -> Any:
    """Run `coro` on the shared background loop and return its result (waiting at most `timeout`
    seconds when given)."""
    return AsyncLoopThread().run(coro, timeout)


def on_background_loop() -> bool:
    """True when called from a coroutine running on the shared background loop (no loop is
    started here)."""
    thread = SingletonMeta.instance(AsyncLoopThread)
    if thread is None:
        return False
    try:
        return asyncio.get_running_loop() is thread.loop
    except RuntimeError:  # no running loop
        return False
