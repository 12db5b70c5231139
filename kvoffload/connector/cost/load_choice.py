"""What the load cost model is asked about and answers: a hit as runs by tier, and the choice
of how much of it to load (``LoadCostModel.choose``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class LoadDecision(enum.Enum):
    LOAD = "load"  # the whole hit (the request waits for its loads)
    PARTIAL = "partial"  # its leading part; the rest recomputed
    RECOMPUTE = "recompute"  # none of it


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of a hit's blocks held by one tier (its medium as jobs carry it)."""

    medium: str
    blocks: int


@dataclass(frozen=True, slots=True)
class LoadChoice:
    blocks: int  # leading blocks of the hit to load
    decision: LoadDecision
    sync: bool  # loaded layer by layer inside the step that schedules the request
    tier: str  # the slowest tier the hit reached (lower case), the counters' label
    why: str  # "measured", "warm-up", "probe", "mode"
    load_s: float  # estimated time to load the whole hit (0 when unknown)
    recompute_s: float  # estimated time to recompute the whole hit (0 when unknown)
    chosen_s: float  # estimated time of the choice
