"""``kvoffload bench fs`` runs end to end: every phase measured for each process count."""

import re

from kvoffload.bench import fs_bench


def test_bench_fs_prints_a_row_per_block_and_process_count(tmp_path, capsys):
    fs_bench.main(["--total-mib", "2", "--reps", "1", "--procs", "1,2", "--blocks", "64", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+Ki", line)]
    assert [(r[0], r[1]) for r in rows] == [("1", "64Ki"), ("2", "64Ki")]
    assert all(float(r[2]) > 0 and float(r[8]) > 0 for r in rows)  # store GB/s, load GB/s
    assert list(tmp_path.iterdir()) == []  # each run's files are removed
