"""Predicted vs published throughput and MFU of public training runs.

    python tests/bench/published_runs.py [--json] [--file tests/bench/published_runs.toml]

Evaluates every run in published_runs.toml with planner's cost model (no subprocess) and
prints, per run, predicted and published MFU (planner's PaLM convention on both sides),
the relative error, tokens/s per GPU, predicted peak memory against the GPU's, and the
source; then the mean absolute relative error against the 15% goal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from planner.fidelity.published import MFU_GOAL, evaluate_all, load_runs, mean_abs_error, result_row

DATA = Path(__file__).with_name("published_runs.toml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--file", type=Path, default=DATA, help="published runs TOML")
    args = parser.parse_args(argv)
    results = evaluate_all(load_runs(args.file))
    mean = mean_abs_error(results)
    if args.json:
        print(json.dumps({"runs": [result_row(r) for r in results], "mean_abs_error": round(mean, 4),
                          "goal": MFU_GOAL}, indent=2))
        return 0
    table = Table(title="planner vs published training runs (MFU in PaLM convention, 6N + 12 L a d s)")
    for column in ("run", "pred MFU", "pub MFU", "error", "pred tok/s/GPU", "pub tok/s/GPU",
                   "pred mem GiB", "source"):
        table.add_column(column, justify="left" if column in ("run", "source") else "right")
    for r in results:
        mem = f"{r.peak_memory_gib:.1f}/{r.gpu_memory_gib:.0f}"
        if r.run.memory_gib is not None:
            mem += f" (pub {r.run.memory_gib:.1f})"
        table.add_row(r.run.name, f"{r.predicted_mfu:.3f}", f"{r.published_mfu:.3f}", f"{r.error:+.1%}",
                      f"{r.predicted_tokens_per_s_per_gpu:,.0f}", f"{r.published_tokens_per_s_per_gpu:,.0f}",
                      mem, r.run.source)
    console = Console(width=220)
    console.print(table)
    verdict = "meets" if mean <= MFU_GOAL else "misses"
    console.print(f"mean absolute relative error {mean:.1%} over {len(results)} runs ({verdict} the "
                  f"{MFU_GOAL:.0%} goal); worst {max(abs(r.error) for r in results):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
