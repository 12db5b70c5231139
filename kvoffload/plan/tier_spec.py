"""The ``--tiers`` chain a plan sizes: ``cpu:32GiB+disk:1TiB``, with ``{a,b,c}`` sweeping a size.

Each tier is ``MEDIUM:SIZE[:OPTION...]``; options are an eviction policy (``lru``, ``arc``) or
``wt`` (write-through: the tier receives every block landing in the one above it; without it,
it receives the blocks evicted there). The first tier is the host tier.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from kvoffload.config.values import MAX_SIZE
from kvoffload.errors import describe_value
from kvoffload.registry import TIER_KINDS

POLICIES = ("lru", "arc")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)$")
_SWEEP = re.compile(r"\{([^{}]*)\}")
#: A sweep larger than this is a typo more often than a plan.
MAX_CONFIGURATIONS = 256


def media() -> tuple[str, ...]:
    """Media a chain can hold: the host tier, then every tier kind the registry knows (a kind
    a user registers, or publishes as a ``kvoffload.tiers`` entry point, is sized like ours)."""
    return ("cpu", *TIER_KINDS.known())


class TierSpecError(ValueError):
    """A ``--tiers`` value that names no chain (the part at fault and the form to use)."""


@dataclass(frozen=True, slots=True)
class PlannedTier:
    medium: str
    size_bytes: int
    policy: str = "lru"
    write_through: bool = False

    @property
    def label(self) -> str:
        return f"{self.medium}:{format_size(self.size_bytes)}"


def format_size(n: int) -> str:
    """The largest binary unit that writes ``n`` as a whole number (or one decimal place)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        v = n / _UNITS[unit]
        if v >= 1 and (v == int(v) or v >= 10):
            return f"{v:g}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


def parse_size(text: str, where: str = "size") -> int:
    m = _SIZE.match(text.strip())
    shown = describe_value(text)
    if not m:
        raise TierSpecError(f"{where} {shown}: write a number and a unit, e.g. 32GiB, 512MiB or 1TiB")
    scaled = float(m.group(1)) * _UNITS[m.group(2)]
    if scaled > MAX_SIZE:
        raise TierSpecError(f"{where} {shown}: too large; at most 1 EiB")
    n = int(scaled)
    if n <= 0:
        raise TierSpecError(f"{where} {shown}: a tier needs a size above zero")
    return n


def expand(spec: str) -> list[str]:
    """Every chain a sweep names, in order: ``cpu:{16,32}GiB+disk:{1,2}TiB`` is four."""
    if not isinstance(spec, str) or not spec.strip():
        raise TierSpecError("--tiers '': give a chain such as cpu:32GiB+disk:1TiB")
    parts = _SWEEP.split(spec)
    literals, choices = parts[0::2], parts[1::2]
    if any("{" in s or "}" in s for s in literals):
        raise TierSpecError(f"--tiers {spec!r}: a sweep is {{a,b,c}} with no braces inside, e.g. cpu:{{16,32}}GiB")
    options: list[list[str]] = []
    for c in choices:
        values = [v.strip() for v in c.split(",")]
        if not all(values):
            raise TierSpecError(f"--tiers {spec!r}: sweep {{{c}}} has an empty value; write {{16,32,64}}")
        options.append(values)
    count = 1
    for o in options:
        count *= len(o)
    if count > MAX_CONFIGURATIONS:
        raise TierSpecError(f"--tiers {spec!r}: {count} configurations; sweep at most {MAX_CONFIGURATIONS}")
    out = []
    for combo in itertools.product(*options):
        text = literals[0]
        for value, lit in zip(combo, literals[1:]):
            text += value + lit
        out.append(text)
    return out


def parse_chain(spec: str) -> tuple[PlannedTier, ...]:
    """One chain (no sweep): its tiers, the host tier first."""
    tiers: list[PlannedTier] = []
    for part in spec.split("+"):
        fields = part.strip().split(":")
        if len(fields) < 2 or not fields[0]:
            raise TierSpecError(f"--tiers {spec!r}: tier {part!r} needs MEDIUM:SIZE, e.g. cpu:32GiB")
        medium = fields[0].lower()
        known = media()
        if medium not in known:
            raise TierSpecError(f"--tiers {spec!r}: medium {fields[0]!r} is not a tier; use {', '.join(known)}")
        if any(t.medium == medium for t in tiers):
            raise TierSpecError(f"--tiers {spec!r}: {medium} appears twice; a chain holds one tier per medium")
        size = parse_size(fields[1], f"--tiers {spec!r}: size")
        policy, wt = "lru", False
        for opt in fields[2:]:
            if opt.lower() in POLICIES:
                policy = opt.lower()
            elif opt.lower() == "wt":
                wt = True
            else:
                raise TierSpecError(f"--tiers {spec!r}: option {opt!r} of {medium}: use a policy "
                                    f"({', '.join(POLICIES)}) or wt (write-through)")
        if wt and not tiers:
            raise TierSpecError(f"--tiers {spec!r}: wt on the first tier; write-through applies to a tier below another")
        tiers.append(PlannedTier(medium, size, policy, wt))
    if tiers[0].medium != "cpu":
        raise TierSpecError(f"--tiers {spec!r}: the chain starts with the host tier; begin with cpu:SIZE")
    return tuple(tiers)


def chain_label(tiers: tuple[PlannedTier, ...]) -> str:
    return "+".join(t.label for t in tiers)
