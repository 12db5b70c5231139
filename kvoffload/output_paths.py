"""Files a command writes at its end (a JSON report, a plot, a log), checked at its start: a long
run must not end in a traceback because a directory is missing or matplotlib is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def check_output(path: str, flag: str, plot: bool = False) -> None:
    """An OSError naming ``flag`` unless ``path`` can be written (a file made to find out is
    removed again); with ``plot``, a ValueError unless matplotlib can be imported."""
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"{flag} {path}: needs matplotlib (pip install 'kvoffload[plot]'), or drop {flag}")
    p = Path(path)
    if p.is_dir():
        raise OSError(f"{flag} {path}: a directory; give a file name")
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as exc:
        raise OSError(f"{flag} {path}: cannot be written ({exc.strerror or exc}); give a writable path") from None
    if not existed:
        p.unlink(missing_ok=True)
