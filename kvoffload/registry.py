"""Loading plugins named as ``"package.module:Name"`` (the one helper every registry uses)."""

from __future__ import annotations

import importlib
from typing import Any


def load_object(target: str, error: type[Exception], what: str) -> Any:
    """Import ``module:attr``; any failure becomes ``error`` naming ``what`` and the target."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise error(f"{what}: {target!r} is not of the form 'package.module:ClassName'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise error(f"{what}: cannot import {target!r} ({exc})") from exc
