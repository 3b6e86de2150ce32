"""Measure every GPU of a cluster and write the per-GPU speed population the straggler model
reads (docs/stragglers.md; planner/fidelity/gpu_speed.py does the work).

One command per node, then one to collect (Slurm shown; any launcher that runs one task per
node works):

    srun --ntasks-per-node=1 python scripts/measure_gpu_speed.py measure --out speeds/
    python scripts/measure_gpu_speed.py collect speeds/ --name my-h100-cluster > my-h100-cluster.toml
    planner plan ... --gpu-speed-spread my-h100-cluster.toml

The collected file also gives the median sustained over burst GEMM rate (`sustained_over_burst`),
to compare with the GPU preset's `sustained_compute` (docs/h100_rates.md section e).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from planner.fidelity.gpu_speed import GEMM_SIZE, collect, measure_node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    measure = sub.add_parser("measure", help="time every GPU of this node at once; write OUT/<host>.json")
    measure.add_argument("--out", type=Path, required=True)
    measure.add_argument("--size", type=int, default=GEMM_SIZE)
    measure.add_argument("--warmup", type=float, default=30.0, help="seconds before timing (reach the power cap)")
    measure.add_argument("--seconds", type=float, default=60.0, help="seconds timed per GPU")
    gather = sub.add_parser("collect", help="print the population of every node's records")
    gather.add_argument("directory", type=Path)
    gather.add_argument("--name", required=True, help="the population's name (a TOML table name)")
    args = parser.parse_args()
    if args.command == "measure":
        records = measure_node(args.size, args.warmup, args.seconds)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{socket.gethostname()}.json").write_text(json.dumps(records, indent=1))
        for r in records:
            burst = 2 * r["gemm_size"] ** 3 / r["burst_seconds_per_gemm"] / 1e12
            print(
                f"{r['host']} GPU {r['index']}: {r['tflops']:.1f} TFLOP/s sustained, {burst:.1f} in a burst",
                file=sys.stderr,
            )
    else:
        sys.stdout.write(collect(args.directory, args.name))


if __name__ == "__main__":
    main()
