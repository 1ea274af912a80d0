"""The control protocol each supported SGLang release requires, decided once per engine.

Owns `Protocol` (what a release asks around weight updates and memory release), the table
`PROTOCOLS` (release -> Protocol), `NEWEST_RELEASE` (the release the local engine speaks),
`protocol_for(version)` and the async helpers every caller goes through: `read_protocol`
(GET /server_info `version`, once per engine), `begin_weights` / `end_weights` (the session
around tensor and distributed updates), `release_memory` / `resume_memory`.

What the releases' schedulers (`managers/scheduler_components/weight_updater.py`) require:
- 0.5.23: `update_weights_from_tensor` and `update_weights_from_distributed` are refused outside a
  session opened by POST /begin_weight_update and closed by POST /end_weight_update; a second
  begin, or an end without begin, is refused. Disk updates need no session.
- 0.5.15.post1: no session endpoints; updates are accepted at any time.
- both: `release_memory_occupation` asserts the scheduler is idle (a failed assert kills the
  server), so /flush_cache is called first and retried until it answers 200 (SGLang answers 400
  while requests run, e.g. aborted ones draining); `resume_memory_occupation` of a tag that is not
  released raises in the scheduler (callers resume only what they released).
A release between two supported ones takes the protocol of the older one; a release older than
every supported one is refused. Nothing else in slime looks at an engine's version.
"""

from __future__ import annotations

import dataclasses
import logging

logger = logging.getLogger(__name__)

SESSION_ENDPOINTS = ("update_weights_from_tensor", "update_weights_from_distributed")


@dataclasses.dataclass(frozen=True)
class Protocol:
    """What one SGLang release requires of a client. `session_endpoints`: the update endpoints that
    must run between /begin_weight_update and /end_weight_update (empty: no session exists)."""

    release: str
    session_endpoints: tuple[str, ...] = ()

    def needs_session(self, endpoint: str) -> bool:
        """Whether an update through `endpoint` (e.g. "update_weights_from_tensor") needs a session."""
        return endpoint.strip("/") in self.session_endpoints


PROTOCOLS: dict[str, Protocol] = {
    "0.5.15.post1": Protocol("0.5.15.post1"),
    "0.5.23": Protocol("0.5.23", session_endpoints=SESSION_ENDPOINTS),
}
NEWEST_RELEASE = "0.5.23"


def _key(version: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version)
    except InvalidVersion as exc:
        raise ValueError(f"engine reports version {version!r}, not a release number") from exc


def protocol_for(version: str | None) -> Protocol:
    """The `Protocol` of SGLang `version` (the newest supported release not newer than it).

    Raises ValueError for a missing version or one older than every supported release."""
    if not version:
        raise ValueError("the engine's /server_info has no `version`: cannot tell which SGLang protocol it speaks")
    if version in PROTOCOLS:
        return PROTOCOLS[version]
    older = [r for r in PROTOCOLS if _key(r) <= _key(version)]
    if not older:
        raise ValueError(f"SGLang {version} is older than every supported release ({', '.join(PROTOCOLS)})")
    chosen = max(older, key=_key)
    logger.warning("SGLang %s is not a supported release; speaking %s's protocol", version, chosen)
    return PROTOCOLS[chosen]


async def read_protocol(client) -> Protocol:
    """The protocol of the engine behind `client` (an `EngineClient`), from /server_info `version`."""
    info = await client.get_server_info()
    return protocol_for(info.get("version"))


async def begin_weights(client, protocol: Protocol, endpoint: str) -> None:
    """Open the weight-update session an update through `endpoint` needs (no-op when none)."""
    if protocol.needs_session(endpoint):
        await client.begin_weight_update()


async def end_weights(client, protocol: Protocol, endpoint: str) -> None:
    """Close the session `begin_weights` opened (no-op when none)."""
    if protocol.needs_session(endpoint):
        await client.end_weight_update()


async def release_memory(client, tags: list[str] | None = None) -> None:
    """Wait until the engine is idle (/flush_cache retried while it answers 400), then release
    the memory of `tags` (None: all). Same in every supported release."""
    await client.flush_cache()
    await client.release_memory_occupation(tags)


async def resume_memory(client, tags: list[str] | None = None) -> None:
    """Take back the memory of `tags` (only tags released before; None: all, valid only when all were)."""
    await client.resume_memory_occupation(tags)
