"""A real mooncake_master on free loopback ports (with a process lending DRAM to the store),
started and stopped per test; tests skip, naming the install, where Mooncake is missing."""

from __future__ import annotations

import pytest

from kvoffload.testing.mooncake_master import MooncakeMaster, mooncake_binary


def _missing() -> str | None:
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        return (f"Mooncake client not importable ({exc}); pip install 'kvoffload[mooncake]' and "
                "apt-get install -y libibverbs1 librdmacm1")
    if mooncake_binary("mooncake_master") is None:
        return "mooncake_master not found; pip install 'kvoffload[mooncake]'"
    return None


MISSING = _missing()
needs_mooncake = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture
def master(tmp_path):
    with MooncakeMaster(str(tmp_path)) as m:
        m.segment_holder("128MB")
        yield m
