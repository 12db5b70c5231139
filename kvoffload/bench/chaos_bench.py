"""kvoffload bench chaos: many random configurations and fault plans against the reference.

Not a speed figure: it prints how many cases ran, how many failed, and for each failure its
seed and configuration (``--seed S --cases 1`` reruns exactly that case).
"""

from __future__ import annotations

import argparse
import logging
import resource
import time

import torch

from kvoffload.testing.chaos import describe, draw_case, run_case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvoffload bench chaos", description=__doc__)
    parser.add_argument("--cases", type=int, default=100, help="how many cases to run (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first case; case i uses seed + i")
    parser.add_argument("--verbose", action="store_true", help="show the warnings the faults provoke")
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error(f"--cases {args.cases}: must be >= 1")
    torch.set_num_threads(1)
    if not args.verbose:
        logging.getLogger("kvoffload").setLevel(logging.ERROR)
    reference: dict = {}
    failures = []
    t0 = time.perf_counter()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i in range(args.cases):
        result = run_case(draw_case(args.seed + i), reference)
        if not result.ok:
            failures.append(result)
            print(f"FAIL seed={result.case.seed}: {result.error.splitlines()[0]}\n     {describe(result.case)}", flush=True)
        if (i + 1) % 25 == 0:
            print(f"... {i + 1}/{args.cases} cases, {len(failures)} failed", flush=True)
    elapsed = time.perf_counter() - t0
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"chaos: {args.cases} cases, {len(failures)} failed, {elapsed:.0f} s, peak RSS +{rss:.0f} MiB")
    if failures:
        print("failing seeds: " + " ".join(str(r.case.seed) for r in failures))
    return 1 if failures else 0
