"""A sandbox for untrusted tool code (Python) called from multi-turn rollouts.

`Sandbox(...)` runs `await sandbox.run(code, timeout=2.0)` in a separate process and returns a
`SandboxResult` (the output, or a clear error); at most `max_concurrency` runs at once.

What it guarantees (Linux; the rollout process must be root or hold CAP_SYS_ADMIN, with util-linux's
`unshare`, `prlimit` and `setpriv`, and `chroot`; `Sandbox()` raises `SandboxUnavailableError` naming what is
missing, and a run where namespaces cannot be created returns that error):
- new PID, network and mount namespaces (`unshare --pid --net --mount --fork --kill-child`). When
  the run ends or is killed, the kernel kills every process it started: nothing is left behind.
- no network: the namespace has only a loopback interface, which is down, so connecting or
  binding anywhere fails ("Network is unreachable").
- its own root file system: a fresh tmpfs (at most `disk_bytes`) holding read-only binds of the
  host's system folders `SYSTEM_DIRS` (/usr, /bin, /lib*, /etc, ...), /dev's null, zero, random
  and urandom, the namespace's /proc (read-only) and the working folder `WORKDIR` (the cwd, also
  $HOME and $TMPDIR), the only writable place, gone with the run. The rest of the host (/work,
  /root, /home, /var, /run, /tmp and the Unix sockets there) is not visible; every host mount is
  also re-mounted read-only inside the namespace.
- the code runs as a random unprivileged uid/gid (no capabilities, `no_new_privs`, no groups), so
  it cannot leave the chroot or undo the read-only mounts; it gets an almost empty environment
  (PATH, HOME, TMPDIR, LANG: the job's API key is not passed).
- limits: address space `memory_bytes` (RLIMIT_AS: an allocation beyond it raises MemoryError),
  `max_processes` processes and threads of that uid (RLIMIT_NPROC, enforced because the uid is
  not root: a fork bomb gets EAGAIN), CPU seconds (wall timeout + 1), file size, open files, no
  core dumps; wall time `timeout` (the whole namespace is killed).
- output: stdout and stderr together, the first `max_output_bytes` bytes kept (`truncated`).
Not guaranteed: files under `SYSTEM_DIRS` that any user may read stay readable; the code may use
a full CPU core until its timeout; kernel exploits are out of scope. The interpreter (`python`,
default /usr/bin/python3) must live under `SYSTEM_DIRS`: the job's virtualenv is not visible.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import shutil
import signal
from dataclasses import dataclass

logger = logging.getLogger(__name__)

WORKDIR = "/tmp/work"
SETUP_FAILED_EXIT = 97
_SETUP_TAG = "slime-sandbox-setup:"
_REQUIRED_TOOLS = ("unshare", "prlimit", "setpriv", "chroot")

# The host's system folders the code sees (read-only): enough to run the interpreter.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")

# Run as root inside the new namespaces: every mount read-only; a fresh tmpfs at /tmp becomes the
# code's root file system, holding read-only binds of SYSTEM_DIRS, /dev's null/zero/random/urandom,
# the namespace's /proc and the working folder; then, chrooted there, the interpreter runs as an
# unprivileged uid. $1 uid, $2 tmpfs size; the rest is the command to run. The shell stays the
# namespace's first process (not `exec`): it keeps unshare's parent-death signal, which the kernel
# clears on a process whose uid changes, and the code cannot signal it or leave its process group;
# so killing unshare kills it, and with it the whole PID namespace. It exits with the code's status
# (128 + N when a signal N killed the code).
_SETUP_SCRIPT = r"""
fail() { echo "{tag} $1" >&2; exit {code}; }
uid="$1"; size="$2"; shift 2
sed 's/\\040/ /g' /proc/self/mounts | while read -r _dev mp _rest; do
    mount -o remount,bind,ro "$mp" 2>/dev/null || fail "cannot make $mp read-only"
done || exit {code}
root=/tmp
mount -t tmpfs -o "size=$size,mode=0755,nosuid,nodev" tmpfs "$root" || fail "cannot mount a tmpfs on /tmp"
for d in {dirs}; do
    if [ -L "/$d" ]; then
        cp -P "/$d" "$root/$d" || fail "cannot copy the link /$d"
    elif [ -d "/$d" ]; then
        mkdir "$root/$d" && mount --rbind "/$d" "$root/$d" && mount -o remount,bind,ro "$root/$d" \
            || fail "cannot bind /$d read-only"
    fi
done
mkdir "$root/proc" "$root/dev" && mount -t proc -o ro,nosuid,nodev,noexec proc "$root/proc" || fail "cannot mount /proc"
for f in null zero random urandom; do
    touch "$root/dev/$f" && mount --bind "/dev/$f" "$root/dev/$f" || fail "cannot bind /dev/$f"
done
mkdir -m 0755 "$root/tmp" && mkdir -m 0700 "$root{workdir}" && chown "$uid:$uid" "$root{workdir}" \
    || fail "cannot create {workdir}"
cd / && unset OLDPWD
chroot "$root" "$@"
"""
for _key, _value in (("{tag}", _SETUP_TAG), ("{code}", str(SETUP_FAILED_EXIT)), ("{workdir}", WORKDIR),
                     ("{dirs}", " ".join(SYSTEM_DIRS))):
    _SETUP_SCRIPT = _SETUP_SCRIPT.replace(_key, _value)

# The tool's program: read the code from stdin, run it as __main__ in the working folder.
_RUNNER = ("import os, sys; os.chdir(" + repr(WORKDIR) + "); code = sys.stdin.read(); sys.stdin.close(); "
           "exec(compile(code, '<tool>', 'exec'), {'__name__': '__main__'})")


class SandboxUnavailableError(RuntimeError):
    """The host lacks what the sandbox needs (a tool, or the right to create namespaces)."""


@dataclass
class SandboxResult:
    """One run: `output` (stdout + stderr, bounded) and `error` (None when the code exited 0)."""

    output: str
    error: str | None
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    uid: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def text(self) -> str:
        """What to show the model: the output, followed by the error if there was one."""
        return self.output if self.ok else f"{self.output}\n[error] {self.error}".lstrip("\n")


class Sandbox:
    """Runs untrusted Python in an isolated, resource-limited process (see the module doc)."""

    def __init__(self, *, memory_bytes: int = 256 << 20, max_processes: int = 16, disk_bytes: int = 16 << 20,
                 max_output_bytes: int = 8192, max_open_files: int = 64, max_concurrency: int = 4,
                 python: str = "/usr/bin/python3") -> None:
        missing = [tool for tool in _REQUIRED_TOOLS if shutil.which(tool) is None]
        if missing:
            raise SandboxUnavailableError(f"the tool sandbox needs util-linux's {', '.join(missing)} on PATH")
        top = python.split("/")[1] if python.startswith("/") else ""
        if top not in SYSTEM_DIRS or not os.path.isfile(python):
            raise SandboxUnavailableError(
                f"sandbox interpreter {python}: not a file under one of the system folders "
                f"/{', /'.join(SYSTEM_DIRS)} (the only ones the code sees), e.g. /usr/bin/python3")
        if max_concurrency < 1 or max_processes < 1 or max_output_bytes < 0:
            raise ValueError("max_concurrency and max_processes must be >= 1, max_output_bytes >= 0")
        self.memory_bytes, self.max_processes, self.disk_bytes = memory_bytes, max_processes, disk_bytes
        self.max_output_bytes, self.max_open_files = max_output_bytes, max_open_files
        self.max_concurrency, self.python = max_concurrency, python
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_loop = None

    def _slots(self) -> asyncio.Semaphore:
        """The concurrency bound of the running event loop (an asyncio semaphore is per loop)."""
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._semaphore_loop is not loop:
            self._semaphore, self._semaphore_loop = asyncio.Semaphore(self.max_concurrency), loop
        return self._semaphore

    def command(self, uid: int, timeout: float) -> list[str]:
        """The command line of one run as `uid` (for logs and tests)."""
        limits = [f"--as={self.memory_bytes}", f"--nproc={self.max_processes}", f"--cpu={math.ceil(timeout) + 1}",
                  f"--fsize={self.disk_bytes}", f"--nofile={self.max_open_files}", "--core=0"]
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs"]
        return ["unshare", "--pid", "--net", "--mount", "--fork", "--kill-child", "--mount-proc",
                "sh", "-c", _SETUP_SCRIPT, "slime-sandbox", str(uid), str(self.disk_bytes),
                "prlimit", *limits, "--", *drop, self.python, "-I", "-c", _RUNNER]

    async def run(self, code: str, timeout: float = 5.0) -> SandboxResult:
        """Run `code` (Python source) and return its output or a clear error; never raises for
        anything the code does."""
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        async with self._slots():
            return await self._run(code, timeout)

    async def _run(self, code: str, timeout: float) -> SandboxResult:
        uid = 1_000_000 + secrets.randbelow(2**30)  # nobody else runs as it: RLIMIT_NPROC counts only us
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8"}
        proc = await asyncio.create_subprocess_exec(
            *self.command(uid, timeout), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
        reader = asyncio.ensure_future(self._feed_and_read(proc, code.encode()))
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.gather(asyncio.shield(reader), proc.wait()), timeout)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            _kill_group(proc)
            await proc.wait()
        output, truncated = await reader
        return _result(output, proc.returncode, timed_out, truncated, uid, timeout)

    async def _feed_and_read(self, proc, code: bytes) -> tuple[bytes, bool]:
        """Feed the code, then read stdout to EOF keeping the first `max_output_bytes` bytes."""
        try:
            proc.stdin.write(code)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):  # it died during setup: its output says why
            pass
        finally:
            proc.stdin.close()
        kept, truncated = bytearray(), False
        while chunk := await proc.stdout.read(65536):
            room = self.max_output_bytes - len(kept)
            truncated = truncated or len(chunk) > room
            kept += chunk[:max(room, 0)]
        return bytes(kept), truncated


def _kill_group(proc) -> None:
    """SIGKILL the run's process group: unshare and the namespace's first process, the root shell
    (its death kills the rest of the PID namespace; it also dies by its parent-death signal)."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _signal_of(rc: int) -> int | None:
    """The signal behind a shell's exit status 128 + N (None for an ordinary exit code)."""
    try:
        return signal.Signals(rc - 128).value if rc > 128 else None
    except ValueError:
        return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _result(raw: bytes, rc: int | None, timed_out: bool, truncated: bool, uid: int, timeout: float) -> SandboxResult:
    output = raw.decode("utf-8", errors="replace")
    if timed_out:
        error = f"timed out after {timeout:g} s (every process of the run was killed)"
    elif rc == 0:
        error = None
    elif rc == SETUP_FAILED_EXIT and _SETUP_TAG in output:
        error = f"sandbox setup failed: {output.split(_SETUP_TAG, 1)[1].strip()}"
    elif output.startswith("unshare:"):
        error = f"sandbox unavailable (namespaces need root or CAP_SYS_ADMIN): {_last_line(output)}"
    elif rc is not None and (rc < 0 or _signal_of(rc)):
        sig = -rc if rc < 0 else _signal_of(rc)
        error = f"killed by {signal.Signals(sig).name}" + (" (CPU time limit)" if sig == signal.SIGXCPU else "")
    else:
        error = f"exit code {rc}: {_last_line(output) or 'no output'}"
    return SandboxResult(output=output, error=error, exit_code=rc, timed_out=timed_out, truncated=truncated, uid=uid)
