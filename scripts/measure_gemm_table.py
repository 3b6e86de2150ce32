"""Measure a bf16 or fp8 GEMM throughput table by shape on this GPU (planner/profile/gemms.py),
in the format of planner/presets/gemm_*.toml, which a GPU preset's `gemm_table` names:

    python scripts/measure_gemm_table.py --dtype fp8 -o profiles/gemm_h100_fp8.toml

Resumable: run it again after an interruption and it measures only the shapes the file lacks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.profile.gemms import (
    DEFAULT_DIMS,
    GEMM_DTYPES,
    gemm_call,
    read_points,
    seconds_per_gemm,
    shapes,
    table_toml,
    tflops,
)


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=GEMM_DTYPES, required=True)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    default = ",".join(map(str, DEFAULT_DIMS))
    for dim in "mnk":
        parser.add_argument(f"--{dim}", type=_dims, default=DEFAULT_DIMS, help=f"values (default {default})")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=20, help="GEMMs per timed batch")
    parser.add_argument("--rounds", type=int, default=5, help="timed batches per shape (median)")
    args = parser.parse_args(argv)

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    environment = {"device": name, "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    source = (
        f"planner/profile/gemms.py on {name} (torch {torch.__version__}): {args.warmup} warm-up GEMMs, median of "
        f"{args.rounds} batches of {args.repeats}"
    )
    points = read_points(args.output.read_text()) if args.output.exists() else {}
    todo = [s for s in shapes(args.m, args.n, args.k) if s not in points]
    for i, shape in enumerate(todo, 1):
        call = gemm_call(*shape, args.dtype, device)
        points[shape] = tflops(shape, seconds_per_gemm(call, device, args.warmup, args.repeats, args.rounds))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        partial = args.output.with_suffix(".partial")
        partial.write_text(table_toml(points, args.dtype, source, environment))
        partial.replace(args.output)  # the file is whole whenever the sweep stops
        print(f"[{i}/{len(todo)}] {shape}: {points[shape]} TFLOP/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
