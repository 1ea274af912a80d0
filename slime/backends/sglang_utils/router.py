"""sglang-router in front of the rollout engines (real SGLang or our local engine).

`RouterProcess` starts the real `sglang_router` package as a subprocess in its own process
group, waits until it answers, registers engines with `POST /workers` (registration is queued by
the router and checked against the worker, so `add_worker` polls `GET /workers` until the engine
is listed) and stops only the process it started. With `--sglang-router-ip/--sglang-router-port`
set, the framework uses that existing router instead and starts none.

Authentication (seen with sglang-router 0.3.2): started with `--api-key KEY` the router answers
401 to every client request without `Authorization: Bearer KEY` (`/generate`, `/workers`, ...),
forwards it on generation requests, and uses a worker's own key for its probes only when the
worker was registered with `{"url", "api_key"}` (else it warns and probes without). So the job's
key (`$SLIME_API_KEY`) goes to the router, on every call below, and into every registration.
sglang-router reads its key only from `--api-key`, so the router is started through
`slime.backends.sglang_utils.router_main`, which takes the key from `$SLIME_API_KEY` and starts
sglang-router in its own process: the key is on no command line (`/proc/<pid>/cmdline` is readable
by every local user), not even for the instant before sglang-router renames its process.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from slime.utils.failure import last_error_line
from slime.utils.misc import free_port
from slime.utils.security import API_KEY_ENV, auth_headers, job_api_key, redact_argv

logger = logging.getLogger(__name__)


class RouterError(RuntimeError):
    """The router did not start, or an engine could not be registered with it."""


# Engine health is ours to decide (the RolloutManager's health monitor restarts and re-registers
# engines, as slime's does): the router's circuit breaker and health checks are off, otherwise a
# few slow answers on a busy machine mark every worker unusable and the router answers
# 503 no_available_workers ("all circuits open or unhealthy") for the rest of the run.
ROUTER_FIXED_FLAGS = ("--disable-circuit-breaker", "--disable-health-check")


ROUTER_LAUNCHER = (sys.executable, "-m", "slime.backends.sglang_utils.router_main")


def router_command(host: str, port: int, policy: str = "round_robin", extra: list[str] | None = None) -> list[str]:
    """The command line that launches sglang-router through `router_main` (`--router-*` flags
    arrive as `extra`, e.g. `--request-timeout-secs` from --router-request-timeout-secs), with
    `ROUTER_FIXED_FLAGS`; never the key, which `router_main` reads from `$SLIME_API_KEY`. Its
    metrics endpoint gets a free port unless given: the default (29000) may be taken, and the
    router then fails to start. It binds `host`, as the router does (its default is every
    interface)."""
    extra = list(extra or [])
    if "--prometheus-port" not in extra:
        extra += ["--prometheus-port", str(free_port(host))]
    if "--prometheus-host" not in extra:
        extra += ["--prometheus-host", host]
    extra += [flag for flag in ROUTER_FIXED_FLAGS if flag not in extra]
    return [
        *ROUTER_LAUNCHER,
        "--host", host, "--port", str(port), "--policy", policy,
        "--log-level", "warn",
        *extra,
    ]


def router_extra_args(args) -> list[str]:
    """`--router-x VALUE` flags of our parser -> sglang-router's `--x VALUE`."""
    out = []
    for dest, value in sorted(vars(args).items()):
        if not dest.startswith("router_") or dest == "router_policy" or value is None or value is False:
            continue
        flag = "--" + dest[len("router_"):].replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def _exit_reason(log_path: Path) -> str | None:
    """Why the router stopped, from its log: the last exception line, else the last line written
    (an argument error, a Rust panic)."""
    own = last_error_line(log_path)
    if own is None and log_path.is_file():
        lines = [line.strip() for line in log_path.read_text(errors="replace")[-4096:].splitlines() if line.strip()]
        own = lines[-1][:500] if lines else None
    return own


class RouterProcess:
    """A sglang-router subprocess we own; `api_key` None means the job's (`$SLIME_API_KEY`).

    Its output goes to `log_path` (appended), else to a temporary file that `stop` removes; a
    router that exits while starting raises RouterError with its last error line and the log's
    path (seen: one exiting for a package missing on a GPU machine, with nothing on record)."""

    def __init__(self, host: str, port: int, policy: str = "round_robin", extra: list[str] | None = None,
                 log_path: str | Path | None = None, api_key: str | None = None):
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"
        self.api_key = api_key or job_api_key()
        self.command = router_command(host, port, policy, extra)
        self.log_path = Path(log_path) if log_path else None
        self.temporary_log = False
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "RouterProcess":
        """`launch()`, then `wait_ready(timeout)`."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> "RouterProcess":
        """Start the process and return at once (`wait_ready` waits until it answers), so a caller
        can do other work while the router starts."""
        if self.log_path is None:
            fd, path = tempfile.mkstemp(prefix=f"sglang-router-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path, self.temporary_log = Path(path), True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        env.pop(API_KEY_ENV, None)
        env |= {API_KEY_ENV: self.api_key} if self.api_key else {}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=env)
        return self

    def wait_ready(self, timeout: float = 60.0) -> "RouterProcess":
        """Wait until the launched router answers; RouterError (and the process stopped) when it
        exits or stays silent for `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                own = _exit_reason(self.log_path)  # the router's own error first
                raise RouterError(f"{own + '; ' if own else ''}sglang-router exited with code {self.process.returncode} "
                                  f"(command: {' '.join(redact_argv(self.command))}; log: {self.log_path})")
            if self._answers():
                logger.info("sglang-router up at %s (log: %s)", self.url, self.log_path)
                return self
            time.sleep(0.05)
        self.stop()
        raise RouterError(f"sglang-router did not answer at {self.url} within {timeout:.0f}s")

    def _answers(self) -> bool:
        try:
            return requests.get(f"{self.url}/workers", timeout=1, headers=auth_headers(self.api_key)).ok
        except requests.RequestException:
            return False

    def stop(self) -> None:
        """Stop the router process group we started (and nothing else); a temporary log goes too."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.temporary_log:
            self.log_path.unlink(missing_ok=True)


def _workers(router_url: str):
    resp = requests.get(f"{router_url}/workers", timeout=10, headers=auth_headers(job_api_key()))
    if not resp.ok:
        raise RouterError(f"router {router_url} answered GET /workers with {resp.status_code} {resp.text[:200]}")
    return resp.json()


def list_workers(router_url: str) -> list[str]:
    """URLs of the engines registered with the router (the job's key sent, as in every call here)."""
    body = _workers(router_url)
    workers = body.get("workers", []) if isinstance(body, dict) else body
    return [w["url"] if isinstance(w, dict) else str(w) for w in workers]


def add_worker(router_url: str, engine_url: str, timeout: float = 60.0) -> None:
    """Register `engine_url` (with the job's key, for the router's calls to it) and wait until the
    router lists it."""
    if engine_url in list_workers(router_url):
        return
    key = job_api_key()
    resp = requests.post(f"{router_url}/workers", json={"url": engine_url, **({"api_key": key} if key else {})},
                         timeout=10, headers=auth_headers(key))
    if not resp.ok:
        raise RouterError(f"router {router_url} refused worker {engine_url}: {resp.status_code} {resp.text}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine_url in list_workers(router_url):
            return
        time.sleep(0.2)
    raise RouterError(f"router {router_url} did not list worker {engine_url} within {timeout:.0f}s "
                      "(is the engine healthy at that address?)")


def remove_worker(router_url: str, engine_url: str) -> None:
    """Unregister an engine (e.g. one that died) by its URL."""
    body = _workers(router_url)
    for worker in body.get("workers", []):
        if worker.get("url") == engine_url and worker.get("id"):
            requests.delete(f"{router_url}/workers/{worker['id']}", timeout=10, headers=auth_headers(job_api_key()))
