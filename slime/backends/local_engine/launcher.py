"""Start and stop a local engine server as a subprocess (its own process group).

Owns `launch_local_engine` and `stop_local_engine`; the rollout side and tests use them.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

from slime.utils.engine_client import wait_until_healthy
from slime.utils.security import API_KEY_ENV

logger = logging.getLogger(__name__)


def launch_local_engine(model_path, port: int, *, host: str = "127.0.0.1", dtype: str = "float32",
                        device: str = "cpu", extra_args: tuple | list = (), timeout: float = 300.0,
                        log_path: str | None = None, env: dict | None = None, api_key: str | None = None,
                        weight_dirs=None, group_hosts=None) -> subprocess.Popen:
    """Start `python -m slime.backends.local_engine` and wait until /health answers.

    `api_key` reaches the server by environment (`$SLIME_API_KEY`, never its command line; None:
    whatever this process's environment holds); `weight_dirs` / `group_hosts` (None: no
    restriction) become its `--allowed-weight-dir` / `--allowed-group-host` flags.

    The child runs in its own session (process group) so `stop_local_engine` can end it and its
    children. Output goes to `log_path` (appended) or is inherited. Raises RuntimeError with the
    exit code if the server dies while starting; stops it and raises TimeoutError if it is not
    healthy within `timeout` seconds.
    """
    cmd = [sys.executable, "-m", "slime.backends.local_engine", "--model-path", str(model_path),
           "--host", host, "--port", str(port), "--dtype", dtype, "--device", device, *map(str, extra_args)]
    for flag, values in (("--allowed-weight-dir", weight_dirs), ("--allowed-group-host", group_hosts)):
        if values is not None and not values:
            raise ValueError(f"{flag}: an empty allow-list would allow everything; give None for that")
        cmd += [word for value in (values or ()) for word in (flag, str(value))]
    env = {**(env or {}), **({API_KEY_ENV: api_key} if api_key else {})}
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True, env={**os.environ, **(env or {})})
    finally:
        if out is not None:
            out.close()
    logger.info("started local engine pid %d on %s:%d", proc.pid, host, port)
    try:
        wait_until_healthy(f"http://{host}:{port}", timeout=timeout, process=proc)
    except TimeoutError:
        stop_local_engine(proc)
        raise
    return proc


def stop_local_engine(proc: subprocess.Popen, timeout: float = 15.0) -> int | None:
    """SIGTERM the engine's process group, SIGKILL it after `timeout` s; returns the exit code."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("local engine pid %d ignored SIGTERM; killing it", proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode
