"""The test master itself: a port another process takes between our probe and the master's
bind must not leave a master that answers for a second and then dies (a CI run lost a vLLM
test to that)."""

from __future__ import annotations

import socket

import pytest

from kvoffload.testing import mooncake_master
from kvoffload.testing.mooncake_master import MooncakeMaster, free_port
from tests.tiers.mooncake.conftest import needs_mooncake


def test_free_ports_come_from_below_the_kernels_ephemeral_range():
    low = mooncake_master._ephemeral_low()
    ports = {free_port() for _ in range(50)}
    assert all(10000 <= p < low for p in ports), sorted(ports)
    assert len(ports) > 40  # random, so two workers rarely pick the same one


@needs_mooncake
@pytest.mark.parametrize("taken", ["metrics_port", "rpc_port"])
def test_a_master_whose_port_is_taken_starts_again_on_fresh_ports(tmp_path, taken):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        m = MooncakeMaster(str(tmp_path))
        setattr(m, taken, squatter.getsockname()[1])
        with m:
            assert getattr(m, taken) != squatter.getsockname()[1]
            assert m.alive()
            for port in (m.rpc_port, m.http_port, m.metrics_port):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()


@needs_mooncake
def test_a_restart_keeps_its_ports_and_says_why_it_failed(tmp_path):
    with MooncakeMaster(str(tmp_path)) as m:
        ports = (m.rpc_port, m.http_port, m.metrics_port)
        m.kill()
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", m.metrics_port))
            squatter.listen()
            with pytest.raises(RuntimeError, match="admin server"):
                m.start()
        assert (m.rpc_port, m.http_port, m.metrics_port) == ports
        m.start()
        assert m.alive()
