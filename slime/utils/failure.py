"""How a failed job is reported: one line, root cause first; the traceback goes to a file.

- `root_cause(error)`: the innermost exception of a chain (a Ray task error's `cause`, then
  `__cause__` links), i.e. the user's or the engine's own error rather than its wrappers.
- `one_line(error)`: "<Type>: <first line of its message>" of the root cause.
- `last_error_line(log_path)`: the last line of a process log that names an exception (an
  engine's own error, read from the tail of its log).
- `save_traceback(error, folder)`: the full traceback appended to `<folder>/error.log`.
"""

from __future__ import annotations

import re
import time
import traceback
from pathlib import Path

ERROR_LOG = "error.log"
_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt))(:.*)?$")
_TAIL_BYTES = 64 * 1024


def root_cause(error: BaseException) -> BaseException:
    """The innermost exception behind `error`: follows `.cause` (ray's RayTaskError) and
    `__cause__` (raise ... from ...) until neither is set."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "cause", None)
        if not isinstance(inner, BaseException):
            inner = error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    return error


def one_line(error: BaseException) -> str:
    """"Type: message" of `error`'s root cause, its message cut to the first non-empty line."""
    cause = root_cause(error)
    lines = [line for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0].strip() if lines else ''}"[:1000]


def last_error_line(log_path: str | Path | None) -> str | None:
    """The last line naming an exception (e.g. "ValueError: ...") in the tail of the log at
    `log_path`, or None (no log, or no such line)."""
    if not log_path or not Path(log_path).is_file():
        return None
    with open(log_path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - _TAIL_BYTES))
        tail = f.read().decode("utf-8", errors="replace").splitlines()
    for line in reversed(tail):
        if _EXCEPTION_LINE.match(line):
            return line.strip()[:500]
    return None


def save_traceback(error: BaseException, folder: str | Path) -> Path | None:
    """Append `error`'s full traceback (with a time stamp) to `<folder>/error.log`; returns the
    path, or None when the folder cannot be written."""
    path = Path(folder) / ERROR_LOG
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n{text}\n")
    except OSError:
        return None
    return path
