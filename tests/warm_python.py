"""A `python` for tests that run our scripts as subprocesses, started from a warm fork server.

Every `python train.py ... --dry-run`, `python tools/convert_*.py ...` a test runs imports torch
and megatron-core first (about 5 s of CPU each, most of a dry run). `warm_python()` returns the
path of an executable that behaves as this interpreter does for the command lines the tests use
(`python SCRIPT ARGS`, `python -m MODULE ARGS`, `python -c CODE ARGS`, with `-u`), but runs them
in a fork of one server process per pytest session that has imported those libraries already
(`PRELOAD`: third-party only; the repository's own modules are imported by each run, fresh).

What a run gets is what a new interpreter gets: the caller's argv, environment, working directory,
stdin / stdout / stderr (the descriptors themselves, passed over a Unix socket), `sys.path`
(script folder, then `$PYTHONPATH`, then the interpreter's own), warnings filters, torch's thread
count from `$OMP_NUM_THREADS`; its exit status or the signal that ended it comes back as the
executable's own; a signal sent to the executable is passed on. What differs: warnings printed
while the libraries in PRELOAD import are printed once by the server (to its log), not by each run,
and the hash seed is the server's. Anything else (other interpreter options, `PYTHON*` variables
other than those handled, a locale other than the server's, a machine with CUDA, where torch's
device state must not be forked) runs the real interpreter unchanged (`exec`), only slower.

Protocol: the client sends one JSON line (argv, env, cwd) with its descriptors 0-2 attached; the
server forks; when the run ends the server answers one JSON line (`{"exit": code}` or
`{"signal": n}`); the client may send `{"signal": n}` lines meanwhile; a client that goes away
takes its run with it (SIGKILL).
"""

from __future__ import annotations

import array
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRELOAD = (
    "numpy",
    "torch",
    "torch.distributed",
    "safetensors.torch",
    "transformers",
    "megatron.core",
    "megatron.core.utils",
    "megatron.core.parallel_state",
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
    "megatron.core.distributed",
    "megatron.core.dist_checkpointing",
    "megatron.core.transformer.transformer_config",
)
# The interpreter's start-up variables a run may set (applied per run: `_run`) ...
HANDLED_PYTHON_ENV = {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE"}
# ... and those it must share with the server (read once at start-up by Python or the C library);
# a run with another value of any of these runs the real interpreter.
FIXED_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "LD_PRELOAD", "LD_LIBRARY_PATH", "MKL_NUM_THREADS",
             "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONPLATLIBDIR", "PYTHONOPTIMIZE", "PYTHONDEBUG",
             "PYTHONINSPECT", "PYTHONVERBOSE", "PYTHONCASEOK", "PYTHONPYCACHEPREFIX", "PYTHONHASHSEED",
             "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONEXECUTABLE", "PYTHONWARNINGS", "PYTHONFAULTHANDLER",
             "PYTHONTRACEMALLOC", "PYTHONPROFILEIMPORTTIME", "PYTHONMALLOC", "PYTHONMALLOCSTATS",
             "PYTHONCOERCECLOCALE", "PYTHONDEVMODE", "PYTHONUTF8", "PYTHONWARNDEFAULTENCODING",
             "PYTHONNODEBUGRANGES", "PYTHONINTMAXSTRDIGITS", "PYTHONSTARTUP")
START_TIMEOUT_S = 300


# ----- client (stdlib only, run with -S -E: it starts in milliseconds) ---------------------------
def client(sock_path: str, argv: list[str]) -> None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock_path)
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode() + b"\n"
    conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])

    def forward(signum, _frame):
        conn.sendall(json.dumps({"signal": signum}).encode() + b"\n")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            sys.stderr.write("warm_python: the server went away\n")
            os._exit(255)
        reply += chunk
    status = json.loads(reply)
    if "signal" in status:
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    os._exit(status["exit"])


# ----- server ----------------------------------------------------------------------------------
def _base_path() -> list[str]:
    """sys.path of a new interpreter without a script folder and $PYTHONPATH entries."""
    extra = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return [p for p in sys.path[1:] if os.path.abspath(p) not in extra]


def _plain(argv: list[str]) -> tuple[str, str, list[str], bool] | None:
    """(kind, target, rest, unbuffered) for `[-u] SCRIPT|-m MOD|-c CODE ARGS`, None for anything else."""
    unbuffered, i = False, 0
    while i < len(argv) and argv[i] == "-u":
        unbuffered, i = True, i + 1
    if i >= len(argv):
        return None
    if argv[i] in ("-m", "-c"):
        return (argv[i], argv[i + 1], argv[i + 2:], unbuffered) if i + 1 < len(argv) else None
    if argv[i].startswith("-"):
        return None
    return "script", argv[i], argv[i + 1:], unbuffered


def _warm_enough(env: dict[str, str], parsed, server_env: dict[str, str]) -> bool:
    return parsed is not None and all(env.get(k) == server_env.get(k) for k in FIXED_ENV)


def _std_streams(unbuffered: bool, encoding: str | None) -> None:
    """The server's own stream objects (libraries may hold them, e.g. in logging handlers) now
    write to the run's descriptors; buffered as a new interpreter buffers them."""
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=stream is sys.stderr or os.isatty(stream.fileno()),
                           write_through=unbuffered)
        if encoding:
            stream.reconfigure(encoding=encoding)


def _run(request: dict, fds: list[int], state: dict) -> None:
    """In the forked child: become the requested interpreter run; never returns."""
    import runpy
    import traceback
    import warnings

    argv, env, cwd = request["argv"], request["env"], request["cwd"]
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    parsed = _plain(argv)
    if not _warm_enough(env, parsed, state["env"]):
        os.execv(sys.executable, [sys.executable, *argv])
    kind, target, rest, unbuffered = parsed
    _std_streams(unbuffered or bool(env.get("PYTHONUNBUFFERED")), env.get("PYTHONIOENCODING"))
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    warnings.filters[:] = state["warnings"]
    warnings._filters_mutated()
    if "torch" in sys.modules:
        threads = env.get("OMP_NUM_THREADS")
        sys.modules["torch"].set_num_threads(int(threads) if threads and threads.isdigit() else state["threads"])
    pythonpath = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = {"script": os.path.dirname(os.path.realpath(target)), "-m": os.getcwd(), "-c": ""}[kind]
    sys.path[:] = [first, *pythonpath, *state["path"]]
    sys.argv = [{"script": target, "-m": target, "-c": "-c"}[kind], *rest]
    code = 0
    try:
        if kind == "script":
            runpy.run_path(target, run_name="__main__")
        elif kind == "-m":
            runpy._run_module_as_main(target, alter_argv=True)
        else:
            import types

            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        code = stop.code
    except BaseException as err:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        tb = err.__traceback__.tb_next if err.__traceback__ else None  # drop this frame
        traceback.print_exception(type(err), err, tb)
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    _finish(code)


def _finish(code: int) -> None:
    """The interpreter's own exit: wait for non-daemon threads, run atexit, flush, exit."""
    import atexit
    import threading

    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code & 0xFF)


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds = b"", []
    while not data.endswith(b"\n"):
        msg, anc, _flags, _addr = conn.recvmsg(1 << 20, socket.CMSG_SPACE(16 * array.array("i").itemsize))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", payload[:len(payload) - len(payload) % 4]).tolist()
        if not msg:
            raise ConnectionError("client closed before its request")
        data += msg
    return json.loads(data), fds


def serve(sock_path: str, parent: int) -> None:
    """Preload, then fork a run per request until `parent` (the pytest process) is gone."""
    import warnings

    state = {"warnings": list(warnings.filters), "env": dict(os.environ)}
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    import threading

    if threading.active_count() != 1:  # forking a process with threads is not safe
        raise RuntimeError(f"warm_python: {threading.active_count()} threads after the preload")
    state["threads"] = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else 1
    state["path"] = _base_path()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    listener.listen(64)
    os.rename(sock_path + ".tmp", sock_path)  # clients see the socket once it accepts
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    runs: dict[int, socket.socket] = {}  # pid -> client connection
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=0.02):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _recv_request(conn)
                except (ConnectionError, ValueError, OSError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for other in runs.values():
                        other.close()
                    conn.close()
                    _run(request, fds, state)
                for fd in fds:
                    os.close(fd)
                runs[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            else:
                pid, conn = key.data, key.fileobj
                data = b""
                try:
                    data = conn.recv(4096)
                except OSError:
                    pass
                if not data:  # the client went away: so does its run
                    selector.unregister(conn)
                    _kill(pid, signal.SIGKILL)
                    continue
                for line in data.splitlines():
                    _kill(pid, json.loads(line)["signal"])
        while runs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = runs.pop(pid, None)
            if conn is None:
                continue
            reply = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.WEXITSTATUS(status)}
            try:
                selector.unregister(conn)
            except (KeyError, ValueError):
                pass
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass
            conn.close()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ----- pytest side -----------------------------------------------------------------------------
_SERVER: dict = {}


def warm_python() -> str:
    """Path of this session's warm `python` (starting its server on first use); `sys.executable`
    on a machine with CUDA."""
    if "path" in _SERVER:
        return _SERVER["path"]
    import torch

    if torch.cuda.is_available():
        _SERVER["path"] = sys.executable
        return sys.executable
    folder = Path(tempfile.mkdtemp(prefix="warm-python-"))
    sock = folder / "sock"
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    env.pop("OMP_NUM_THREADS", None)  # the server records torch's default thread count
    log = open(folder / "server.log", "w")  # noqa: SIM115 - the server writes it for its life
    proc = subprocess.Popen([sys.executable, "-c", f"from tests.warm_python import serve; serve({str(sock)!r}, {os.getpid()})"],
                            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            cwd=repo, start_new_session=True)
    log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"warm_python server did not start: {(folder / 'server.log').read_text()[-3000:]}")
        time.sleep(0.05)
    exe = folder / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -S -E -s {Path(__file__).resolve()} {sock} \"$@\"\n")
    exe.chmod(0o755)
    import atexit

    atexit.register(_stop, proc, folder)
    _SERVER.update(path=str(exe), proc=proc)
    return str(exe)


def _stop(proc: subprocess.Popen, folder: Path) -> None:
    proc.kill()
    proc.wait()
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # the client: warm_python.py SOCKET ARGS...
    client(sys.argv[1], sys.argv[2:])
