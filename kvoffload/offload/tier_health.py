"""TierHealth: the I/O health a fallible tier keeps, as a component the tier holds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class TierHealth:
    """MAX_IO_ERRORS failed copies in a row (reads and writes counted apart: a tier that takes
    writes but fails every read is of no use) take the tier out of service for
    ``retry_after_s``; then it is tried again. ``describe`` names the tier in log lines."""

    MAX_IO_ERRORS = 3

    def __init__(self, retry_after_s: float, describe: Callable[[], str]) -> None:
        self.retry_after_s = retry_after_s
        self.describe = describe
        self.num_io_errors = 0
        self.num_outages = 0
        self._errors_in_a_row = [0, 0]  # reads, writes
        self._out_until = 0.0

    @property
    def in_service(self) -> bool:
        if self._out_until and time.monotonic() >= self._out_until:
            self._out_until = 0.0
            self._errors_in_a_row = [0, 0]
            logger.warning("%s: back in service after an I/O outage", self.describe())
        return not self._out_until

    def note_io(self, ok: bool, write: bool = False) -> None:
        if ok:
            self._errors_in_a_row[write] = 0
            return
        self.num_io_errors += 1
        self._errors_in_a_row[write] += 1
        if self._errors_in_a_row[write] >= self.MAX_IO_ERRORS and not self._out_until:
            self._out_until = time.monotonic() + self.retry_after_s
            self.num_outages += 1
            logger.warning("%s: %d %s errors in a row; out of service for %g s, serving from the "
                           "other tiers and recompute", self.describe(), self._errors_in_a_row[write],
                           "write" if write else "read", self.retry_after_s)
