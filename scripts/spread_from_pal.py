"""Rebuild a population of planner/presets/gpu_speed_spread.toml from the PAL artifact's data.

The per-GPU measurements of Jain et al., "PAL: A Variability-Aware Policy for Scheduling ML
Workloads in GPU Clusters" (SC'24, arXiv 2408.11919), are public in their artifact,
github.com/hal-uw/blox-pal (commit da726cabd3113ff50cb9860b040b479fa7114221):

    git clone https://github.com/hal-uw/blox-pal && cd blox-pal
    python scripts/spread_from_pal.py aggregated_data/sim/sgemm-longhorn-agg.csv --kind sgemm
    python scripts/spread_from_pal.py aggregated_data/ls6/resnet-ls6-agg.csv --kind resnet-ls6

(the path to this script being the planner's). Prints the population's `times` line: one
value per GPU, in the source's unit.

- sgemm: rows are runs of 100 cuBLAS SGEMM kernels (25536^3, volta_sgemm_128x32) on one
  V100 of TACC Longhorn; `perf` is the run's kernel duration (ms); a GPU (`uuid`) has many
  runs, of which the median is taken (run-to-run noise out, the GPU's own speed kept).
- resnet-ls6: one row per GPU of TACC Lonestar6 (A100), `perf` the mean ResNet-50 training
  iteration (s) over that GPU's runs.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict


def per_gpu_times(path: str, kind: str) -> list[float]:
    """One time per GPU from the artifact's CSV (module docstring)."""
    runs: dict[str, list[float]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            runs[row["uuid"]].append(float(row["perf"]))
    if kind == "resnet-ls6" and any(len(r) != 1 for r in runs.values()):
        raise SystemExit(f"{path}: expected one row per GPU")
    return [statistics.median(r) for r in runs.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--kind", choices=("sgemm", "resnet-ls6"), required=True)
    args = parser.parse_args()
    times = sorted(per_gpu_times(args.csv, args.kind))
    print(f"# {len(times)} GPUs")
    print("times = [" + ", ".join(f"{t:.6g}" for t in times) + "]")


if __name__ == "__main__":
    main()
