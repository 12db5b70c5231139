"""What a transfer reports, shared by both halves: the worker half fills these in, the
scheduler half reads them. Kept apart from the handlers so the scheduler half imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.offload.abstract import LoadStoreSpec

DEVICE_TO_HOST = "device_to_host"
HOST_TO_DEVICE = "host_to_device"

TransferSpec = tuple[LoadStoreSpec, LoadStoreSpec]


@dataclass(frozen=True, slots=True)
class TransferResult:
    job_id: int
    success: bool
    nbytes: int
    seconds: float
    direction: str
    #: Source slots found corrupt, misplaced or unreadable: the scheduler drops them.
    bad_block_ids: tuple[int, ...] = ()
    #: The copy failed with an I/O error (the tier's health counts these).
    io_error: bool = False
    #: Bad source blocks by reason ("checksum", "auth", "key", "format", "missing"), for the
    #: kvoffload_tier_rejected_blocks_total{tier,reason} counter.
    rejected: tuple[tuple[str, int], ...] = ()
    #: A store the tier did not take (backpressure): not an error, nothing was written.
    skipped: bool = False
    #: A load given up at the scheduler's word (slower than recomputing): nothing was written.
    cancelled: bool = False


class StoreSkipped(Exception):
    """A store not submitted because its tier is too slow now (StoreBackpressure)."""


class LoadCancelled(Exception):
    """A load given up before it wrote the device blocks (the scheduler half's call)."""


class BlockTransferError(Exception):
    """A copy failed at known source slots; ``io``: an I/O error, else bad data or key."""

    def __init__(self, message: str, slots: list[int], io: bool = False, reasons: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.slots = slots
        self.io = io
        self.reasons = reasons or {}


@dataclass(frozen=True, slots=True)
class ReadProgress:
    """A load job reading now: for how long (its own time), the share of it read (whole pieces),
    the share one piece is, and how long the piece in progress has been reading."""

    seconds: float
    done: float = 0.0
    piece: float = 1.0
    piece_s: float | None = None
