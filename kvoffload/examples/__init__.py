"""Example offload configs shipped with the package, so an installed kvoffload can run them by
name (``kvoffload run --config cpu``) without a checkout."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent


def known_examples() -> list[str]:
    return sorted(p.stem for p in _HERE.glob("*.yaml"))


def resolve_config(value: str) -> str:
    """An existing file path as given, else the packaged example of that name; anything else
    is returned unchanged, for the config loader to report."""
    if Path(value).expanduser().exists() or not (_HERE / f"{value}.yaml").exists():
        return value
    return str(_HERE / f"{value}.yaml")
