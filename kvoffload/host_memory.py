"""How much host memory a new allocation can take now: the kernel's ``MemAvailable`` (what it
can hand out without swapping, page cache it would drop included), else the free pages.

A tier or a device cache larger than this was allocated anyway and met the OOM killer with no
word of why; the allocations check it first and refuse in one line.
"""

from __future__ import annotations

import os


def available_memory_bytes() -> int | None:
    """Bytes a new host allocation can take now (None where the system does not say)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return None
