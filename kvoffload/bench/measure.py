"""Repeated measurements for the benchmarks: each figure is the median of several runs with its
spread (half the range), ratios are taken run by run, and a benchmark warns when the machine is
already busy (its figures then read low and noisy)."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvoffload.help_format import DefaultsFormatter


@dataclass(frozen=True, slots=True)
class Sample:
    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        return (max(self.values) - min(self.values)) / 2

    def fmt(self, spec: str = ".2f", scale: float = 1.0) -> str:
        return f"{self.median * scale:{spec}} ±{self.spread * scale:{spec}}"

    def ratio(self, other: Sample) -> Sample:
        """Run-by-run ratio self / other (the runs were interleaved, so each pair shares conditions)."""
        return Sample(tuple(a / b if b else 0.0 for a, b in zip(self.values, other.values)))


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def sample(fn: Callable[[], float], reps: int) -> Sample:
    """``reps`` figures from ``fn`` (each call one run)."""
    return Sample(tuple(fn() for _ in range(reps)))


def interleaved(fns: dict[str, Callable[[], float]], reps: int) -> dict[str, Sample]:
    """Each figure ``reps`` times, alternating between them, so drift hits all alike."""
    values: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            values[name].append(fn())
    return {k: Sample(tuple(v)) for k, v in values.items()}


def load_warning() -> str | None:
    """A warning when other work already loads the machine (1-minute load average)."""
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 0.5 * cores:
        return (f"warning: this machine is busy (1-minute load {load:.1f} on {cores} cores): figures will read "
                "low and noisy; rerun on an idle machine")
    return None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the option and the value on error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


class _BenchParser(argparse.ArgumentParser):
    """Every option gets a help line, so ``--help`` shows its default even where no text was given."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and str(args[0]).startswith("-") and not kwargs.get("help"):
            kwargs["help"] = str(args[-1]).lstrip("-").replace("-", " ")  # "(default: ...)" needs a help text
        return super().add_argument(*args, **kwargs)


def bench_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser: its module docstring's first paragraph as the description (doc
    markup dropped), every option's default in ``--help``."""
    summary = (doc or "").split("\n\n")[0].replace("``", "").replace("`", "")
    return _BenchParser(prog=f"kvoffload bench {name}", description=summary, formatter_class=DefaultsFormatter)


def add_reps(parser: argparse.ArgumentParser, default: int = 5) -> None:
    parser.add_argument("--reps", type=positive_int, default=default,
                        help="runs per figure (median ± half-range)")


def preamble(reps: int) -> str:
    """The line every benchmark prints first: how figures are reported, and any load warning."""
    warning = load_warning()
    return f"figures: median ± half-range of {reps} runs" + (f"\n{warning}" if warning else "")
