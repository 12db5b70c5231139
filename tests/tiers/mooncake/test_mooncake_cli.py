"""`kvoffload run --replicas 2` on a Mooncake config shows the second replica served from the
shared tier; `kvoffload bench remote` runs against a master it starts itself."""

from __future__ import annotations

import yaml

from kvoffload.cli import main
from tests.tiers.mooncake.conftest import needs_mooncake

pytestmark = needs_mooncake


def _row(out: str, name: str) -> list[str]:
    line = next(x for x in out.splitlines() if x.startswith(name))
    return line[len(name):].split()


def test_run_shows_a_second_replica_hitting_the_shared_tier(master, tmp_path, capsys):
    cfg = tmp_path / "mooncake.yaml"
    cfg.write_text(yaml.safe_dump({"tiers": [{"name": "cpu", "medium": "cpu", "capacity": "4MiB"},  # 64 demo blocks
                                             master.tier(segment="64MiB", local_buffer="16MiB")]}))
    rc = main(["run", "--config", str(cfg), "--replicas", "2", "--conversations", "6", "--turns", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert _row(out, "prefix hits (mooncake)")[-1] != "0" and int(_row(out, "prefix hits (mooncake)")[-1]) > 0
    assert "outputs identical to the run without offload: yes" in out
    assert "no offload   replica 1   replica 2" in out


def test_replicas_with_a_disk_tier_are_refused(capsys):
    assert main(["run", "--config", "cpu_disk", "--replicas", "2"]) == 2
    assert "a disk tier has one owner" in capsys.readouterr().err


def test_bench_remote_prints_ours_raw_and_ratio(capsys):
    main(["bench", "remote", "--reps", "1", "--total-mib", "2", "--batch", "8"])
    out = capsys.readouterr().out
    assert out.count("ratio") == 5 and "lookup of a 64-block request" in out
