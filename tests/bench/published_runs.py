"""Predicted vs published step time, throughput and memory of public training runs.

    python tests/bench/published_runs.py [--json | --markdown | --sensitivity] [--file tests/bench/published_runs.toml]

Evaluates every run in published_runs.toml (or `--file`'s: tests/bench/preregistered_runs.toml
is the pre-registered validation set, docs/accuracy_preregistered.md) with planner's cost
model (no subprocess) and prints, per run, the published and predicted step time and their
relative error, MFU in planner's (PaLM) convention on both sides, predicted peak memory against
the GPU's and the published one, then each run's `planner evaluate` command by its number; then the
errors per source and overall (held-out runs also on their own).
`--markdown` prints the accuracy block the README embeds; `--json` one JSON object, each run
with its `planner evaluate` command; `--commands` only those commands. Each prediction is the
one its command prints (tests/fidelity/test_published_commands.py runs a sample).
`--sensitivity` prints one table instead: each global factor of planner/presets/factor_ranges.toml
at its low end, default and high end, and the set's mean |step error| and mean signed step error
at each (planner/fidelity/sensitivity.py; progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from planner.fidelity.published import (
    by_source,
    evaluate_all,
    evaluate_command,
    load_runs,
    residuals_json,
    result_row,
    summarize,
)
from planner.fidelity.published_report import layout_label, markdown_report
from planner.fidelity.sensitivity import (
    load_factor_ranges,
    sensitivity,
    sensitivity_markdown,
)
from planner.request import command_text

DATA = Path(__file__).with_name("published_runs.toml")
RESIDUALS = Path(__file__).parents[2] / "planner" / "presets" / "residuals.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON object")
    output.add_argument("--markdown", action="store_true", help="print the README's accuracy block")
    output.add_argument(
        "--residuals",
        action="store_true",
        help="write planner/presets/residuals.json (the development set's step errors, "
        "behind every prediction's interval)",
    )
    output.add_argument(
        "--commands",
        action="store_true",
        help="print the `planner evaluate` command that predicts each run, and nothing else",
    )
    output.add_argument(
        "--sensitivity",
        action="store_true",
        help="print the errors with each global factor at the ends of its stated range",
    )
    parser.add_argument("--file", type=Path, default=DATA, help="published runs TOML")
    args = parser.parse_args(argv)
    runs = load_runs(args.file)
    if args.commands:
        for run in runs:
            print(f"# {run.name}\n{command_text(evaluate_command(run))}")
        return 0
    if args.sensitivity:
        rows = sensitivity(runs, load_factor_ranges(), lambda line: print(line, file=sys.stderr, flush=True))
        print(sensitivity_markdown(rows), end="")
        return 0
    results = evaluate_all(runs)
    if args.residuals:
        RESIDUALS.write_text(residuals_json(results))
        print(f"wrote {RESIDUALS}")
        return 0
    if args.markdown:
        print(markdown_report(results), end="")
        return 0
    groups = by_source(results)
    held = [r for r in results if r.run.held_out]
    if args.json:
        print(
            json.dumps(
                {
                    "runs": [{**result_row(r), "command": command_text(evaluate_command(r.run))} for r in results],
                    "overall": asdict(summarize(results)),
                    # A file with no held_out-tagged row (the pre-registered set, held out as a whole) has none to summarise.
                    "held_out": asdict(summarize(held)) if held else None,
                    "by_source": {source: asdict(summarize(group)) for source, group in groups.items()},
                },
                indent=2,
            )
        )
        return 0
    table = Table(title="planner vs published training runs (step error = predicted / published - 1)")
    for column in (
        "#",
        "run",
        "layout",
        "pub step s",
        "pred step s",
        "step error",
        "pub MFU",
        "pred MFU",
        "pred mem GiB",
        "source",
    ):
        table.add_column(column, justify="left" if column in ("run", "layout", "source") else "right")
    for number, r in enumerate(results, start=1):
        mem = f"{r.peak_memory_gib:.1f}/{r.gpu_memory_gib:.0f}"
        if r.run.memory_gib is not None:
            mem += f" (pub {r.run.memory_gib:.1f})"
        name = r.run.name + (" [held out]" if r.run.held_out else "")
        table.add_row(
            str(number),
            name,
            layout_label(r.run),
            f"{r.published_step_time_s:.3g}",
            f"{r.predicted_step_time_s:.3g}",
            f"{r.step_error:+.1%}",
            f"{r.published_mfu:.3f}",
            f"{r.predicted_mfu:.3f}",
            mem,
            r.run.source_id,
        )
    console = Console(width=200)
    console.print(table)
    console.print("each prediction is what its command prints:", markup=False, highlight=False)
    for number, r in enumerate(results, start=1):
        console.print(
            f"{number:>3}  {command_text(evaluate_command(r.run))}", markup=False, highlight=False, soft_wrap=True
        )
    for source, group in [*groups.items(), ("held out", held), ("all", results)]:
        if not group:
            continue
        s = summarize(group)
        console.print(
            f"{source:>20}: {s.runs:2d} runs, mean |step error| {s.mean_abs:5.1%}, "
            f"mean signed {s.mean_signed:+6.1%}, worst {s.max_abs:5.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
