"""Real torch.distributed.pipelining schedules on CPU processes (gloo) vs planner's simulator.

    python tests/bench/pipelined_cpu.py --procs 2
    python tests/bench/pipelined_cpu.py --procs 4 --schedules 1f1b zbv --json out.json

Prints, per schedule, the predicted and measured step time and the peak bytes autograd keeps
saved per rank; the method is in planner/fidelity/pipelined.py and docs/accuracy_pipelined.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict

import torch

from planner.fidelity.pipelined import DEFAULT_CASES, BenchConfig, Case, compare, format_table, measure

_DEFAULT = BenchConfig()
_VPP = {case.schedule: case.vpp for case in DEFAULT_CASES}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2, help="pipeline ranks P (processes)")
    parser.add_argument(
        "--schedules",
        nargs="+",
        default=[c.schedule for c in DEFAULT_CASES],
        help="schedule names (V: 2 for interleaved_1f1b and zbv, else 1)",
    )
    parser.add_argument("--vpp", type=int, default=None, help="chunks per rank for every schedule")
    parser.add_argument("--layers", type=int, default=_DEFAULT.num_layers)
    parser.add_argument("--microbatches", type=int, default=_DEFAULT.num_microbatches)
    parser.add_argument("--threads", type=int, default=_DEFAULT.threads, help="torch threads per process")
    parser.add_argument("--rounds", type=int, default=_DEFAULT.rounds)
    parser.add_argument("--json", default=None, help="write measurements and comparisons here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = BenchConfig(
        num_layers=args.layers, num_microbatches=args.microbatches, threads=args.threads, rounds=args.rounds
    )
    cases = [Case(name, args.vpp or _VPP.get(name, 1)) for name in args.schedules]
    start = time.perf_counter()
    measurements = measure(args.procs, config, cases)
    rows = [compare(m) for m in measurements]
    print(format_table(rows))
    print(
        f"({args.procs} processes x {args.threads} thread(s) on {torch.get_num_threads()}-thread host "
        f"{platform.machine()}, torch {torch.__version__}; {time.perf_counter() - start:.0f} s)"
    )
    if args.json:
        record = {
            "config": asdict(config),
            "procs": args.procs,
            "torch": torch.__version__,
            "measurements": [asdict(m) for m in measurements],
            "comparisons": [{**asdict(r), "error": r.error} for r in rows],
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
