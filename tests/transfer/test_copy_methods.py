"""The choice of a CUDA copy method per row width, with a fake probe (the real one runs in tests/cuda)."""

import logging
import threading

import pytest

from kvoffload_ext.copies.copy_methods import BATCH, COPY, D2H, H2D, KERNEL, CopyMethods, width_class


def fake_probe(table, calls):
    def probe(method, row_bytes, direction):
        calls.append((method, row_bytes, direction))
        return table.get((method, row_bytes, direction))

    return probe


@pytest.mark.parametrize(("row", "cls"), [(1, 1), (2, 2), (3, 4), (6000, 8192), (8192, 8192), (8193, 16384)])
def test_width_class_is_the_power_of_two_at_or_above(row, cls):
    assert width_class(row) == cls


def test_fastest_method_per_width_and_direction_measured_once():
    table = {(KERNEL, 8192, D2H): 48.0, (BATCH, 8192, D2H): 30.0, (COPY, 8192, D2H): 4.0,
             (KERNEL, 8192, H2D): 20.0, (BATCH, 8192, H2D): 41.0, (COPY, 8192, H2D): 3.0,
             (KERNEL, 1 << 20, D2H): 40.0, (BATCH, 1 << 20, D2H): 52.0, (COPY, 1 << 20, D2H): 53.0}
    calls = []
    chosen = CopyMethods("fake", fake_probe(table, calls), [KERNEL, BATCH, COPY])
    assert chosen.method(8192, D2H) == KERNEL
    assert chosen.method(6000, D2H) == KERNEL  # same class: no new probe
    assert chosen.method(8192, H2D) == BATCH
    assert chosen.method(1 << 20, D2H) == COPY
    assert len(calls) == 9  # three classes x three methods, each once
    assert [(r.row_bytes, r.direction, r.method) for r in chosen.rows()] == [
        (8192, D2H, KERNEL), (1 << 20, D2H, COPY), (8192, H2D, BATCH)]
    assert chosen.rows()[0].gbps == {KERNEL: 48.0, BATCH: 30.0, COPY: 4.0}


def test_a_method_that_cannot_run_is_never_chosen_and_none_left_means_copy():
    calls = []
    chosen = CopyMethods("fake", fake_probe({(COPY, 4096, D2H): 2.0}, calls), [KERNEL, BATCH, COPY])
    assert chosen.method(4096, D2H) == COPY
    assert chosen.rows()[0].gbps == {COPY: 2.0}
    nothing = CopyMethods("fake", fake_probe({}, []), [BATCH])
    assert nothing.method(4096, H2D) == COPY
    # No probe could run (no room on the device): the choice's own rule for unmeasured widths.
    full = CopyMethods("fake", fake_probe({}, []), [KERNEL, COPY], lambda w: KERNEL if w < 256 << 10 else COPY)
    assert (full.method(8192, D2H), full.method(1 << 20, D2H)) == (KERNEL, COPY)
    assert full.rows()[0].gbps == {}
    assert full.rows()[0].describe() == "8 KiB rows device->host: kernel (not measured)"


def test_prepare_settles_a_layout_in_both_directions_and_logs_it_once(caplog):
    table = {(m, w, d): float(i + 1) for i, m in enumerate([COPY, BATCH, KERNEL]) for w in (8192, 65536)
             for d in (D2H, H2D)}
    calls = []
    chosen = CopyMethods("cuda:0 (fake)", fake_probe(table, calls), [KERNEL, BATCH, COPY])
    with caplog.at_level(logging.INFO, logger="kvoffload"):
        rows = chosen.prepare([8192, 8000, 65536])
        again = chosen.prepare([65536, 8192])
    assert [(r.row_bytes, r.direction) for r in rows] == [(8192, D2H), (8192, H2D), (65536, D2H), (65536, H2D)]
    assert again == rows  # sorted by width, nothing measured again
    assert len(calls) == 12
    lines = [r.getMessage() for r in caplog.records if "copy methods" in r.getMessage()]
    assert lines == ["copy methods for cuda:0 (fake): 8 KiB rows device->host: kernel 3.0 GB/s (batch 2.0, copy 1.0); "
                     "8 KiB rows host->device: kernel 3.0 GB/s (batch 2.0, copy 1.0); 64 KiB rows device->host: "
                     "kernel 3.0 GB/s (batch 2.0, copy 1.0); 64 KiB rows host->device: kernel 3.0 GB/s "
                     "(batch 2.0, copy 1.0)"]


def test_threads_asking_for_one_width_share_one_measurement():
    calls = []
    gate = threading.Barrier(8)

    def slow_probe(method, row_bytes, direction):
        calls.append(method)
        return {KERNEL: 5.0, COPY: 1.0}[method]

    chosen = CopyMethods("fake", slow_probe, [KERNEL, COPY])
    got = []

    def ask():
        gate.wait()
        got.append(chosen.method(16384, D2H))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [KERNEL] * 8
    assert sorted(calls) == [COPY, KERNEL]


def test_an_sm_free_method_within_ten_percent_of_the_kernel_is_kept():
    table = {(KERNEL, 65536, D2H): 50.0, (BATCH, 65536, D2H): 46.0, (COPY, 65536, D2H): 30.0,
             (KERNEL, 65536, H2D): 50.0, (BATCH, 65536, H2D): 44.0, (COPY, 65536, H2D): 30.0}
    chosen = CopyMethods("fake", fake_probe(table, []), [KERNEL, BATCH, COPY])
    assert chosen.method(65536, D2H) == BATCH  # 0.92 of the kernel, no SM taken
    assert chosen.method(65536, H2D) == KERNEL  # 0.88: the kernel's bandwidth wins
