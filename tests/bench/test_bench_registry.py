"""Every benchmark module is a `kvoffload bench NAME` (so it ships in the wheel and the docs can
name it), and each one's --help works without vLLM or a GPU."""

from pathlib import Path

import pytest

import kvoffload.bench
from kvoffload.cli import BENCHMARKS, main

MODULES = sorted(p.stem.removesuffix("_bench") for p in Path(kvoffload.bench.__file__).parent.glob("*_bench.py"))


def test_every_bench_module_is_listed_and_every_listed_name_has_a_module():
    assert sorted(BENCHMARKS) == MODULES


@pytest.mark.parametrize("name", MODULES)
def test_each_benchmark_answers_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", name, "--help"])
    assert exc.value.code == 0
    assert f"kvoffload bench {name}" in capsys.readouterr().out
