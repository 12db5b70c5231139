"""What a caller knows about a request's future, for the eviction policy.

An agent framework knows that a request ended in a tool call and will be back in seconds with
the same context, or ended a turn and may not be back for minutes; a router knows the session;
an operator knows which prompts must stay. ``RequestHint`` carries that per request (vLLM:
``kv_transfer_params={"kvoffload": {...}}``; the bundled engine: ``add_request(hint=...)``),
``parse_hint`` validates it (a bad field is a one-line warning and is dropped, never a failed
request), and ``BlockHint`` is what a policy receives with the blocks the request uses: the
same facts on the tier's clock.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

logger = logging.getLogger("kvoffload")

#: The fields a hint may carry; anything else is warned about and ignored.
HINT_FIELDS = ("session", "expect_return_s", "priority", "lease_s")
#: Longest session name kept (a router's ids are short; a huge one is a client bug).
MAX_SESSION_CHARS = 256
#: Longest lease a request may ask for; the policy also bounds the share of the tier leased.
MAX_LEASE_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class RequestHint:
    """Per request, every field optional. ``expect_return_s``: seconds until the caller expects
    to send the next request of this session (a tool call's latency); None = unknown.
    ``priority``: higher stays longer among blocks otherwise equal. ``lease_s``: keep this
    request's blocks that long (within the policy's bounded share for leases)."""

    session: str | None = None
    expect_return_s: float | None = None
    priority: int = 0
    lease_s: float | None = None

    def at(self, now: float) -> BlockHint:
        """The hint on a clock: absolute return and lease times."""
        return BlockHint(self.session, None if self.expect_return_s is None else now + self.expect_return_s,
                         self.priority, None if self.lease_s is None else now + self.lease_s, now)


@dataclass(frozen=True, slots=True)
class BlockHint:
    """A request's hint as a policy sees it, with the blocks the request uses (seconds on the
    clock of whoever calls: monotonic time in an engine, trace time in ``kvoffload sim``)."""

    session: str | None
    return_at: float | None
    priority: int
    lease_until: float | None
    now: float


_warned: set[str] = set()


def _warn(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("kvoffload: %s; the field is ignored and the request served as usual (logged once)", message)


def _number(name: str, value: object, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        _warn(name, f"hint {name}={value!r}: give a number of seconds in [{low:g}, {high:g}]")
        return None
    return float(value)


def parse_hint(raw: object) -> RequestHint | None:
    """A request's ``{"session", "expect_return_s", "priority", "lease_s"}`` (each optional), or
    None where there is nothing usable. Never raises: a bad field is dropped with a warning."""
    if raw is None:
        return None
    if isinstance(raw, RequestHint):
        return raw
    if not isinstance(raw, dict):
        _warn("type", f"hint {raw!r:.80}: give a mapping with any of {', '.join(HINT_FIELDS)}")
        return None
    for key in raw:
        if key not in HINT_FIELDS:
            _warn(f"field:{key}", f"hint field {key!r:.80} is unknown: use {', '.join(HINT_FIELDS)}")
    session = raw.get("session")
    if session is not None and (not isinstance(session, (str, int)) or isinstance(session, bool)
                                or not 0 < len(str(session)) <= MAX_SESSION_CHARS):
        _warn("session", f"hint session={session!r:.80}: give a string of 1-{MAX_SESSION_CHARS} characters")
        session = None
    ret = raw.get("expect_return_s")
    ret = None if ret is None else _number("expect_return_s", ret, 0.0, MAX_LEASE_S)
    lease = raw.get("lease_s")
    lease = None if lease is None else _number("lease_s", lease, 0.0, MAX_LEASE_S)
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -1000 <= priority <= 1000:
        _warn("priority", f"hint priority={priority!r:.80}: give an integer in [-1000, 1000]")
        priority = 0
    hint = RequestHint(None if session is None else str(session), ret, priority, lease)
    return None if hint == RequestHint() else hint
