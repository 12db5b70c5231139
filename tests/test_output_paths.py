"""Files written at the end of a long run are checked at its start: `bench serve --plot` ran 260 s
and then died with a ModuleNotFoundError traceback where matplotlib was missing."""

from __future__ import annotations

import importlib.util
import time

import pytest

from kvoffload import cli
from kvoffload.bench import serve_bench


@pytest.fixture()
def no_matplotlib(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))


def test_bench_serve_refuses_a_plot_without_matplotlib_before_it_runs(tmp_path, capsys, no_matplotlib):
    started = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        serve_bench.main(["--engine", "bundled", "--plot", str(tmp_path / "ttft.png")])
    assert exc.value.code == 2 and time.monotonic() - started < 5
    assert "--plot" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("flag", ["--json", "--write-log", "--plot"])
def test_bench_serve_refuses_an_unwritable_output_before_it_runs(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as exc:
        serve_bench.main(["--engine", "bundled", flag, str(tmp_path / "no" / "such" / "out")])
    assert exc.value.code == 2
    assert f"{flag} " in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_plan_refuses_a_plot_without_matplotlib_before_the_replay(tmp_path, capsys, no_matplotlib):
    assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB",
                     "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr()
    assert "needs matplotlib" in err.err and err.out == ""
