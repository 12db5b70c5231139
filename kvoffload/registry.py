"""Loading plugins named as ``"package.module:Name"`` (the one helper every registry uses)."""

from __future__ import annotations

import importlib
from typing import Any


def load_object(target: str, error: type[Exception], what: str) -> Any:
    """Import ``module:attr``; any failure becomes ``error`` naming ``what`` and the target."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise error(f"{what}: {target!r} is not of the form 'package.module:ClassName'")
    if module_name.startswith("."):
        raise error(f"{what}: {target!r} is a relative module; give the full dotted path, e.g. 'mypkg.mod:{attr}'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise error(f"{what}: cannot import {target!r} ({exc})") from None
