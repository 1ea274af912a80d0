"""Access rules of the local engine: the API key, the weight folders and the rendezvous hosts.

Owns `Guard` (built from the server flags) and `add_auth_middleware`. The key check follows
SGLang's (`sglang/srt/utils/auth.py`, 0.5.15.post1 and 0.5.23, started with `--api-key` only):
every endpoint needs `Authorization: Bearer <key>` except `/health*`, `/ready*` and `/metrics*`
(probes), and a request without it is answered 401 `{"error": "Unauthorized"}` before any handler
runs. The two allow-lists have no SGLang counterpart (there the key is the only guard):
`/update_weights_from_disk` loads only from inside `--allowed-weight-dir` folders and
`/init_weights_update_group` joins only a master at an `--allowed-group-host`. Each is off when
its flag is not given (a standalone engine, as SGLang); the Ray job always gives all three.
"""

from __future__ import annotations

import dataclasses

from slime.backends.local_engine.sampling import RequestError
from slime.utils.security import bearer_matches, path_within

# SGLang's probe paths, open even with a key (k8s probes, Prometheus).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


@dataclasses.dataclass(frozen=True)
class Guard:
    """`api_key` None: no authentication; `weight_dirs` / `group_hosts` None: no restriction."""

    api_key: str | None = None
    weight_dirs: tuple[str, ...] | None = None
    group_hosts: tuple[str, ...] | None = None

    def allows_request(self, path: str, authorization: str | None) -> bool:
        """Whether a request to `path` with that `Authorization` header may proceed."""
        if self.api_key is None or path.startswith(OPEN_PREFIXES):
            return True
        return bearer_matches(authorization, self.api_key)

    def check_weight_path(self, model_path: str) -> None:
        """Raise `RequestError` unless `model_path` lies inside an allowed weight folder."""
        if self.weight_dirs is not None and not path_within(model_path, self.weight_dirs):
            raise RequestError(f"model_path {model_path!r} is outside the job's folders "
                               f"({', '.join(self.weight_dirs) or 'none allowed'}); refused")

    def check_group_host(self, master_address: str) -> None:
        """Raise `RequestError` unless `master_address` is an allowed rendezvous host."""
        if self.group_hosts is not None and str(master_address) not in self.group_hosts:
            raise RequestError(f"master_address {master_address!r} is not one of the job's trainer addresses "
                               f"({', '.join(self.group_hosts) or 'none allowed'}); refused")


class _KeyMiddleware:
    """ASGI middleware (not BaseHTTPMiddleware, which would hide client disconnects from /generate,
    as SGLang notes): answers 401 to HTTP requests its guard does not allow."""

    def __init__(self, app, guard: Guard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") != "OPTIONS":
            headers = dict(scope.get("headers") or [])
            authorization = headers.get(b"authorization", b"").decode("latin-1") or None
            if not self.guard.allows_request(scope.get("path", ""), authorization):
                from fastapi.responses import JSONResponse

                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def add_auth_middleware(app, guard: Guard) -> None:
    """Make `app` answer 401 to requests `guard` does not allow, before routing (no-op without a key)."""
    if guard.api_key is not None:
        app.add_middleware(_KeyMiddleware, guard=guard)
