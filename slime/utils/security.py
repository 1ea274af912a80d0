"""The job's API key and the checks built on it (no heavy imports).

Owns `API_KEY_ENV` (the environment variable every process of a job reads the key from),
`ensure_job_api_key` / `job_api_key`, `auth_headers`, `bearer_matches` (SGLang's check: the
`Authorization: Bearer <key>` header, compared in constant time), `redact_argv` (secret flag
values of a command line replaced before it is logged), `secret_flags_in` and `path_within` (a folder allow-list).

One key per job: `ensure_job_api_key` keeps a key already in `$SLIME_API_KEY` (so an external
router can be started with it), else takes `--sglang-api-key`, else generates one with
`secrets.token_hex(32)` (never starting with '-', which a command line would read as a flag).
Engines, the router and every client of the job use the same key; it is handed to processes by
environment, never on a command line (readable by every local user) and never written to disk by
us: SGLang and sglang-router read it only from `--api-key`, so they are started through launchers
of ours that take it from `$SLIME_API_KEY` (`slime.backends.sglang_utils.sglang_main`, `router_main`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

API_KEY_ENV = "SLIME_API_KEY"
REDACTED = "<redacted>"
# Command-line flags whose value is a credential (SGLang's and sglang-router's spellings included).
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--wandb-key", "--sglang-api-key", "--sglang-admin-api-key")


def job_api_key() -> str | None:
    """The job's key from `$SLIME_API_KEY` (None when unset or empty: no authentication)."""
    return os.environ.get(API_KEY_ENV) or None


def ensure_job_api_key(configured: str | None = None) -> str:
    """The job's key, set in this process's environment so that every child inherits it:
    `$SLIME_API_KEY` if set, else `configured` (e.g. --sglang-api-key), else a fresh random one."""
    # hex: a key starting with '-' would read as a flag on the engines' and router's command lines
    key = job_api_key() or configured or secrets.token_hex(32)
    os.environ[API_KEY_ENV] = key
    return key


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`{"Authorization": "Bearer <key>"}` (SGLang's and sglang-router's scheme), {} without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def bearer_matches(authorization: str | None, api_key: str) -> bool:
    """Whether an `Authorization` header value carries `api_key` as a bearer token (constant time)."""
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), api_key.encode())


def redact_argv(argv: list[str]) -> list[str]:
    """`argv` with the value of every `SECRET_FLAGS` flag (`--flag VALUE` or `--flag=VALUE`)
    replaced by REDACTED, for logs and error messages."""
    out, hide_next = [], False
    for word in map(str, argv):
        flag, eq, _value = word.partition("=")
        if hide_next:
            out.append(REDACTED)
        elif eq and flag in SECRET_FLAGS:
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(word)
        hide_next = not hide_next and word in SECRET_FLAGS
    return out


def secret_flags_in(argv: list[str]) -> list[str]:
    """The `SECRET_FLAGS` present in `argv` (`--flag VALUE` or `--flag=VALUE`), in order: a launcher
    of ours refuses them, since a command line is readable by every local user."""
    return [w.partition("=")[0] for w in map(str, argv) if w.partition("=")[0] in SECRET_FLAGS]


def path_within(path: str | os.PathLike, roots) -> bool:
    """Whether `path`, with symlinks and `..` resolved, is one of `roots` or inside one of them."""
    target = Path(os.path.realpath(path))
    return any(target == Path(os.path.realpath(r)) or Path(os.path.realpath(r)) in target.parents for r in roots)
