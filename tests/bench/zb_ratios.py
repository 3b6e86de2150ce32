"""Predicted vs published zero-bubble / interleaved vs 1F1B throughput ratios (Qi et al. 2024).

    python tests/bench/zb_ratios.py [--markdown] [--no-auto] [--file tests/bench/published_zb.toml]

For every setup of published_zb.toml, each schedule's samples per GPU per second over 1F1B's,
published and as `planner.predict` gives it (planner/fidelity/zero_bubble.py), the ratio error
(predicted / published - 1) per row, then mean |error|, mean signed error and the worst row
per table and schedule and over all rows; then 1F1B's own absolute error per setup, and the cost
model's F, I (T_B), W and p2p times against the paper's profiled ones (appendix D). The
"auto" column is the ratio with planner.schedule.auto_zb's order at the paper's memory limit
(ZB-1p: p, ZB-2p: 2p micro-batches); `--no-auto` skips it (faster). `--markdown` prints
markdown tables (docs/accuracy_pipelined.md embeds them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.fidelity.zero_bubble import (
    PassTimeResult,
    RatioResult,
    baseline_errors,
    evaluate,
    load_pass_times,
    load_rows,
    pass_time_errors,
    row_name,
    summarize,
)

DATA = Path(__file__).with_name("published_zb.toml")


def _rows_table(results: list[RatioResult]) -> list[str]:
    lines = [
        "| setup | GPUs | mbs x m | paper | planner (V) | published ratio | predicted | error | auto |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        auto = "" if r.auto_ratio_error is None else f"{r.auto_ratio_error:+.1%}"
        lines.append(
            f"| {r.row.setup} | {r.row.gpus} | {r.row.mbs} x {r.row.microbatches} | {r.row.schedule} | "
            f"{r.planner_schedule} ({r.vpp}) | {r.published_ratio:.3f} | {r.predicted_ratio:.3f} | "
            f"{r.ratio_error:+.1%} | {auto} |"
        )
    return lines


def _summary_table(results: list[RatioResult]) -> list[str]:
    groups: dict[str, list[RatioResult]] = {}
    for r in results:
        groups.setdefault(r.row.table.split(" (")[0], []).append(r)
    for r in sorted(results, key=lambda r: r.row.schedule):
        groups.setdefault(f"schedule {r.row.schedule}", []).append(r)
    table4_zb = [r for r in results if r.row.table == "Table 4" and r.row.schedule in ("ZB-1p", "ZB-2p")]
    groups["Table 4 ZB-1p + ZB-2p"] = table4_zb
    groups["all"] = results
    lines = ["| group | ratios | mean abs error | mean signed | worst | worst row |", "|---|---:|---:|---:|---:|---|"]
    for name, group in groups.items():
        s = summarize({row_name(r): r.ratio_error for r in group})
        lines.append(f"| {name} | {s.rows} | {s.mean_abs:.1%} | {s.mean_signed:+.1%} | {s.max_abs:.1%} | {s.worst} |")
    return lines


def _baseline_table(errors: dict[str, float]) -> list[str]:
    lines = ["| setup | 1F1B predicted / published samples/s - 1 |", "|---|---:|"]
    lines += [f"| {setup} | {error:+.1%} |" for setup, error in errors.items()]
    s = summarize(errors)
    lines.append(f"| mean abs / signed / worst | {s.mean_abs:.1%} / {s.mean_signed:+.1%} / {s.max_abs:.1%} |")
    return lines


def _pass_table(results: list[PassTimeResult]) -> list[str]:
    lines = ["| setup | F (T_F) | I (T_B) | W (T_W) | p2p (T_comm) |", "|---|---:|---:|---:|---:|"]
    lines += [
        f"| {r.setup} | {r.forward:+.1%} | {r.backward_input:+.1%} | {r.backward_weight:+.1%} | {r.comm:+.1%} |"
        for r in results
    ]
    means = [
        sum(abs(getattr(r, f)) for r in results) / len(results)
        for f in ("forward", "backward_input", "backward_weight", "comm")
    ]
    lines.append("| mean abs | " + " | ".join(f"{m:.1%}" for m in means) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="markdown tables")
    parser.add_argument("--no-auto", action="store_true", help="skip the automatic zero-bubble orders")
    parser.add_argument("--file", type=Path, default=DATA, help="published zero-bubble TOML")
    args = parser.parse_args(argv)
    rows = load_rows(args.file)
    results = evaluate(rows, auto=not args.no_auto)
    passes = pass_time_errors(rows, load_pass_times(args.file))
    blocks = [
        _summary_table(results),
        _rows_table(results),
        _baseline_table(baseline_errors(rows)),
        _pass_table(passes),
    ]
    if args.markdown:
        print("\n\n".join("\n".join(block) for block in blocks))
        return 0
    for block in blocks:
        for line in block:
            if not line.startswith("|---"):
                print("  ".join(cell.strip() for cell in line.strip("|").split("|")))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
