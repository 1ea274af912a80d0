"""One real SGLang server process per rollout engine: start, health-check, stop.

Owns `SGLangEngine` (the process handle), `prepare` (args -> the process's command and env, not
started), `launch` (args -> a healthy engine) and the
`EngineHandle` protocol that the RolloutManager expects from any engine kind.

The lifecycle matches the local engine's launcher (`slime.backends.local_engine.launcher`): the
server runs as a subprocess in its own session (process group), start-up waits on the shared
`slime.utils.engine_client.wait_until_healthy` (a server that dies while starting raises at once
with its exit code), and `stop()` signals only that process group. The handle is also Popen-like
(`pid`, `poll()`, `wait()`, `returncode`) so a generic process-group stop can end it too.

Engine-kind choice lives above the backends (they never import each other): the Ray layer keeps
`{"sglang": this module's launch, "local": the local engine's launcher}` and picks by flag or by
CUDA + sglang availability.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from typing import Protocol

from slime.backends.sglang_utils.launch_env import server_env
from slime.backends.sglang_utils.server_args import (DEFAULT_LAUNCHER, engine_nnodes, server_command,
                                                     key_env, sglang_server_args)
from slime.utils.arguments.sglang import DEFAULT_ENGINE_START_TIMEOUT
from slime.utils.engine_client import wait_until_healthy
from slime.utils.failure import last_error_line
from slime.utils.misc import free_port
from slime.utils.security import job_api_key, redact_argv

logger = logging.getLogger(__name__)

class EngineHandle(Protocol):
    """What a launched engine of any kind offers the rollout side."""

    url: str

    def is_alive(self) -> bool:
        """True while the server process runs."""

    def stop(self, timeout: float = 15.0) -> int | None:
        """End the server's own process group; returns its exit code."""


def visible_device_count(env: dict[str, str]) -> int | None:
    """Number of GPUs listed in `env["CUDA_VISIBLE_DEVICES"]`, None when it is unset."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return len([d for d in value.split(",") if d.strip()])


class SGLangEngine:
    """A SGLang server subprocess (`python -m slime.backends.sglang_utils.sglang_main`, SGLang's
    launch_server with the key by environment) for the ServerArgs `fields` of one engine.

    `visible_devices` (e.g. "4,5,6,7") becomes the child's CUDA_VISIBLE_DEVICES, else the parent's
    is inherited; `fields["base_gpu_id"]` counts within those devices, and the engine's GPUs on
    this node (tp * pp / nnodes) must fit after it. `launcher` replaces the `python -m
    slime.backends.sglang_utils.sglang_main` prefix (tests start a fake server through the same
    path). `fields["api_key"]` reaches the server as `$SLIME_API_KEY`, never on its command line.
    Output is appended to `log_path` (else inherited); the environment is the parent's with slime's
    SGLang settings (`launch_env.server_env`), then `env`, then the key.
    """

    def __init__(self, fields: dict, *, visible_devices: str | None = None, log_path: str | None = None,
                 env: dict[str, str] | None = None, launcher: tuple[str, ...] | list[str] = DEFAULT_LAUNCHER):
        self.fields = dict(fields)
        self.command = server_command(self.fields, launcher)
        self.env = server_env(self.fields, dict(os.environ), {**(env or {}), **key_env(self.fields)})
        if visible_devices is not None:
            self.env["CUDA_VISIBLE_DEVICES"] = visible_devices
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._check_devices()

    def _check_devices(self) -> None:
        visible = visible_device_count(self.env)
        per_node = self.fields.get("tp_size", 1) * self.fields.get("pp_size", 1) // self.fields.get("nnodes", 1)
        last = self.fields.get("base_gpu_id", 0) + per_node
        if visible is not None and last > visible:
            raise ValueError(f"engine needs GPUs {self.fields.get('base_gpu_id', 0)}..{last - 1} of this node but "
                             f"CUDA_VISIBLE_DEVICES={self.env['CUDA_VISIBLE_DEVICES']!r} lists {visible} "
                             "(give the engine's devices as visible_devices, or check base_gpu_id)")

    @property
    def url(self) -> str:
        """Base URL of the server's HTTP API ("http://host:port")."""
        return f"http://{self.fields['host']}:{self.fields['port']}"

    @property
    def serves_http(self) -> bool:
        """Only node rank 0 of a multi-node engine runs the HTTP server."""
        return self.fields.get("node_rank", 0) == 0

    def start(self, timeout: float = DEFAULT_ENGINE_START_TIMEOUT) -> "SGLangEngine":
        """Start the server in its own process group; on node rank 0 wait until /health answers.

        Raises RuntimeError naming the exit code if the process dies while starting; stops it and
        raises TimeoutError if it is not healthy within `timeout` seconds. Returns self.
        """
        if self.process is not None:
            raise RuntimeError(f"engine at {self.url} was already started (pid {self.process.pid})")
        out = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - handed to the child
        try:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT if out else None,
                                            start_new_session=True, env=self.env)
        finally:
            if out is not None:
                out.close()
        logger.info("started SGLang engine pid %d (%s): %s", self.process.pid, self.url,
                    " ".join(redact_argv(self.command)))
        if self.serves_http:
            try:
                wait_until_healthy(self.url, timeout=timeout, process=self.process)
            except RuntimeError as error:  # the engine's own error first, then its exit code and log
                own = last_error_line(self.log_path)
                hint = f"; see {self.log_path}" if self.log_path else ""
                raise RuntimeError(f"SGLang engine failed to start: {own + '; ' if own else ''}{error}{hint}") from error
            except TimeoutError:
                self.stop()
                raise
        return self

    def is_alive(self) -> bool:
        """True while the server process runs."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the engine's own process group, SIGKILL it after `timeout` s; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                logger.warning("SGLang engine pid %d ignored SIGTERM; killing its group", self.process.pid)
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode

    # Popen-like surface, so process-group helpers written for the local engine accept this handle.
    @property
    def pid(self) -> int | None:
        """Process id of the server (None before `start`)."""
        return None if self.process is None else self.process.pid

    @property
    def returncode(self) -> int | None:
        """Exit code once the server ended, else None."""
        return None if self.process is None else self.process.returncode

    def poll(self) -> int | None:
        """`Popen.poll` of the server process."""
        return self.process.poll() if self.process is not None else None

    def wait(self, timeout: float | None = None) -> int | None:
        """`Popen.wait` of the server process."""
        return self.process.wait(timeout=timeout) if self.process is not None else None


def prepare(args, *, engine_rank: int, host: str, port: int, num_engines: int | None = None,
            nccl_port: int | None = None, dist_init_addr: str | None = None, base_gpu_id: int = 0,
            node_rank: int = 0, visible_devices: str | None = None, log_path: str | None = None,
            env: dict[str, str] | None = None,
            launcher: tuple[str, ...] | list[str] = DEFAULT_LAUNCHER) -> SGLangEngine:
    """Engine `engine_rank`'s SGLang process on this node (`node_rank` of the engine's nodes), not
    started: its `command` and `env` are what `start()` runs.

    `num_engines` None means --rollout-num-gpus / --rollout-num-gpus-per-engine; `nccl_port` None
    picks a free port on `host`; `base_gpu_id` counts within the visible devices. See
    `sglang_server_args` for the fields and `SGLangEngine` for devices, logs and the launcher. The
    engine's key (by environment) is the job's (`$SLIME_API_KEY`; none when unset).
    """
    if num_engines is None:
        num_engines = args.rollout_num_gpus // args.rollout_num_gpus_per_engine
    fields = sglang_server_args(
        args, engine_rank=engine_rank, num_engines=num_engines, host=host, port=port,
        nccl_port=nccl_port if nccl_port is not None else free_port(host), dist_init_addr=dist_init_addr,
        base_gpu_id=base_gpu_id, node_rank=node_rank, nnodes=engine_nnodes(args), api_key=job_api_key())
    return SGLangEngine(fields, visible_devices=visible_devices, log_path=log_path, env=env,
                        launcher=launcher)


def launch(args, *, timeout: float | None = None, **where) -> SGLangEngine:
    """`prepare(args, **where)` started; node rank 0 returns once /health answers, within `timeout`
    seconds (None: --engine-start-timeout)."""
    timeout = timeout if timeout is not None else getattr(args, "engine_start_timeout", DEFAULT_ENGINE_START_TIMEOUT)
    return prepare(args, **where).start(timeout=timeout)
