"""What a caller knows about a request's future, for the eviction policy.

An agent framework knows that a request ended in a tool call and will be back in seconds with
the same context, or ended a turn and may not be back for minutes; a router knows the session;
an operator knows which prompts must stay. ``RequestHint`` carries that per request (vLLM:
``kv_transfer_params={"kvoffload": {...}}``; the bundled engine: ``add_request(hint=...)``),
``parse_hint`` validates it (a bad field is a one-line warning and is dropped, never a failed
request), and ``BlockHint`` is what a policy receives with the blocks the request uses: the
same facts on the tier's clock.

Hints are client input on a shared server: every field may be hostile (a 5,000-digit integer,
NaN, a megabyte of text, a nested object, another tenant's session name). ``RequestHint``
refuses anything outside the documented bounds when it is built, and ``parse_hint`` is total:
whatever it is given, it returns a valid hint or None and logs a bounded number of warnings.
Sessions are scoped to a tenant by the scheduler half (``HintRelay``), never by name alone.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kvoffload.config import MAX_PRIORITY

logger = logging.getLogger("kvoffload")

#: The fields a hint may carry; anything else is warned about and ignored.
HINT_FIELDS = ("session", "expect_return_s", "priority", "lease_s")
#: Longest session name kept (a router's ids are short; a huge one is a client bug).
MAX_SESSION_CHARS = 256
#: Longest lease, and furthest announced return, a request may give (seconds).
MAX_LEASE_S = 24 * 3600.0
MAX_RETURN_S = MAX_LEASE_S
#: An integer session id is kept if it fits in 64 bits (vLLM's own bound on request fields).
_MAX_INT_SESSION = 1 << 64


class HintError(ValueError):
    """A hint field outside its documented bounds; the message names the value and the fix."""


def show(value: object) -> str:
    """A short, safe rendering of a client's value for a message: never the whole of a huge
    string or container, never ``str()`` of an integer too long to print."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 64 else f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else f"{value[:40]!r}... ({len(value)} characters)"
    if isinstance(value, (list, tuple, dict, set)):
        return f"<a {type(value).__name__} of {len(value)} items>"
    return f"<a {type(value).__name__}>"


def _seconds(name: str, value: object, high: float) -> float | None:
    if value is None:
        return None
    number: float | None = None
    if isinstance(value, float) and math.isfinite(value):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) <= high:
        number = float(value)  # a huge int is refused before float() could overflow
    if number is None or not 0.0 <= number <= high:
        raise HintError(f"hint {name}={show(value)}: give a number of seconds in [0, {high:g}]")
    return number


def _session(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and -_MAX_INT_SESSION < value < _MAX_INT_SESSION:
        return str(value)
    if isinstance(value, str) and 0 < len(value) <= MAX_SESSION_CHARS:
        return value
    raise HintError(f"hint session={show(value)}: give a string of 1-{MAX_SESSION_CHARS} characters")


def _priority(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and -MAX_PRIORITY <= value <= MAX_PRIORITY:
        return value
    raise HintError(f"hint priority={show(value)}: give an integer in [-{MAX_PRIORITY}, {MAX_PRIORITY}]")


@dataclass(frozen=True, slots=True)
class RequestHint:
    """Per request, every field optional. ``expect_return_s``: seconds until the caller expects
    to send the next request of this session (a tool call's latency); None = unknown.
    ``priority``: higher stays longer among blocks otherwise equal (within the operator's
    ``hints.max_priority`` and the policy's share for raised priorities). ``lease_s``: keep this
    request's blocks that long (within the policy's bounded share for leases). Built directly or
    parsed, a hint outside these bounds raises ``HintError``."""

    session: str | None = None
    expect_return_s: float | None = None
    priority: int = 0
    lease_s: float | None = None

    def __post_init__(self) -> None:
        _session(self.session)
        if self.session is not None and not isinstance(self.session, str):
            raise HintError(f"hint session={show(self.session)}: give a string of 1-{MAX_SESSION_CHARS} characters")
        _seconds("expect_return_s", self.expect_return_s, MAX_RETURN_S)
        _seconds("lease_s", self.lease_s, MAX_LEASE_S)
        _priority(self.priority)

    def at(self, now: float, tenant: bytes | None = None) -> BlockHint:
        """The hint on a clock: absolute return and lease times. With ``tenant`` (a
        ``tenant_digest``) the policy's session key is ``(tenant, session)``."""
        session: object | None = self.session
        if session is not None and tenant is not None:
            session = (tenant, session)
        return BlockHint(session, None if self.expect_return_s is None else now + self.expect_return_s,
                         self.priority, None if self.lease_s is None else now + self.lease_s, now, tenant)


#: The most bytes of a tenant's parts that are hashed: a client cannot make the hash costly.
MAX_TENANT_BYTES = 4096


class _TooLarge(Exception):
    pass


def _canonical(value: object, out: list[bytes], room: list[int], depth: int = 0) -> None:
    """``value`` as tagged, length-prefixed bytes, equal exactly for equal values (a mapping's
    entries in a fixed order), appended to ``out``; _TooLarge past ``room`` bytes, 8 levels, or
    for a type JSON does not have."""
    if isinstance(value, bytes):
        data = b"b" + value
    elif isinstance(value, str):
        data = b"s" + value.encode("utf-8", "surrogatepass")
    elif value is None or isinstance(value, bool):
        data = b"n" + repr(value).encode()
    elif isinstance(value, int):
        if value.bit_length() > 8 * MAX_TENANT_BYTES:
            raise _TooLarge
        data = b"i" + format(value, "x").encode()  # hex: no digit limit, no float rounding
    elif isinstance(value, float):
        data = b"f" + value.hex().encode()
    elif isinstance(value, list | tuple | dict) and depth < 8:
        if len(value) > MAX_TENANT_BYTES:
            raise _TooLarge
        parts: list[bytes] = []
        if isinstance(value, dict):
            entries = []
            for k, v in value.items():
                kv: list[bytes] = []
                _canonical(k, kv, room, depth + 1)
                _canonical(v, kv, room, depth + 1)
                entries.append(b"".join(kv))
            parts = sorted(entries)
        else:
            for v in value:
                _canonical(v, parts, room, depth + 1)
        data = (b"d" if isinstance(value, dict) else b"l") + b"".join(parts)
    else:
        raise _TooLarge
    room[0] -= len(data) + 8
    if room[0] < 0:
        raise _TooLarge
    out.append(len(data).to_bytes(8, "little") + data)


def tenant_digest(parts: Iterable[object]) -> bytes:
    """16 bytes naming a tenant from what the engine knows of a request (its cache salt, its
    adapter's digest, the operator's tenant entries): equal parts, equal tenant, and different
    parts different tenants, whatever their type (``{"org": "acme"}`` is not ``{"org":
    "globex"}``). Parts whose encoding passes ``MAX_TENANT_BYTES`` (or nest past 8 levels, or
    are no JSON type) name a tenant of their own, met by no other request: fail closed."""
    out: list[bytes] = []
    try:
        for part in parts:
            _canonical(part, out, [MAX_TENANT_BYTES])
    except _TooLarge:
        _warn("tenant", f"a tenant entry of a request is larger than {MAX_TENANT_BYTES} bytes, nested past 8 levels "
              "or not a JSON value", "the request is a tenant of its own (its hints meet no other request's)")
        return secrets.token_bytes(16)
    h = hashlib.blake2b(digest_size=16)
    for data in out:
        h.update(data)
    return h.digest()


@dataclass(frozen=True, slots=True)
class BlockHint:
    """A request's hint as a policy sees it, with the blocks the request uses (seconds on the
    clock of whoever calls: monotonic time in an engine, trace time in ``kvoffload sim``).
    ``session`` is whatever the caller keys sessions by: the scheduler half gives a
    ``(tenant, name)`` pair, so two tenants' sessions of one name never meet."""

    session: object | None
    return_at: float | None
    priority: int
    lease_until: float | None
    now: float
    #: Whose request it is (a ``tenant_digest``; None: one tenant for all). A hint may raise the
    #: standing of a block another tenant's session holds, never lower it.
    tenant: bytes | None = None


#: Warnings already logged, by kind (a bounded set: one entry per kind, never per value).
_warned: set[str] = set()


def _warn(kind: str, message: str, outcome: str = "the field is ignored") -> None:
    if kind not in _warned:
        _warned.add(kind)
        logger.warning("kvoffload: %s; %s and the request served as usual (logged once)", message, outcome)


def parse_hint(raw: object, max_priority: int = MAX_PRIORITY) -> RequestHint | None:
    """A request's ``{"session", "expect_return_s", "priority", "lease_s"}`` (each optional), or
    None where there is nothing usable. Never raises, whatever ``raw`` is: a bad field is
    dropped with a warning (one per kind of fault, ever). A priority above ``max_priority``
    (the operator's ceiling) is lowered to it."""
    try:
        hint = _parse(raw)
    except Exception as exc:  # noqa: BLE001 - the last guard: a hint never fails a request
        _warn("unexpected", f"hint {show(raw)} could not be read ({type(exc).__name__})")
        return None
    if hint is not None and hint.priority > max_priority:
        _warn("max_priority", f"hint priority={hint.priority} is above hints.max_priority={max_priority} (an "
                              "operator raises hints.max_priority to let clients ask for more)",
              f"it counts as {max_priority}")
        hint = replace(hint, priority=max_priority)
    return None if hint is None or hint == RequestHint() else hint


def _parse(raw: object) -> RequestHint | None:
    if raw is None or isinstance(raw, RequestHint):
        return raw
    if not isinstance(raw, dict):
        _warn("type", f"hint {show(raw)}: give a mapping with any of {', '.join(HINT_FIELDS)}")
        return None
    unknown = [k for k in raw if k not in HINT_FIELDS]
    if unknown:
        _warn("field", f"hint field {show(unknown[0])} is unknown: use {', '.join(HINT_FIELDS)}")
    fields: dict[str, object] = {}
    for name, check in (("session", _session), ("priority", _priority),
                        ("expect_return_s", lambda v: _seconds("expect_return_s", v, MAX_RETURN_S)),
                        ("lease_s", lambda v: _seconds("lease_s", v, MAX_LEASE_S))):
        if name not in raw:
            continue
        try:
            fields[name] = check(raw[name])
        except HintError as exc:
            _warn(name, str(exc))
    return RequestHint(**fields)  # type: ignore[arg-type]
