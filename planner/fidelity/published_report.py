"""The accuracy table of the published-runs check as Markdown (what docs/accuracy_published.md
embeds; the README quotes its per-source table).

`markdown_report` is pure: results in, text out. `python tests/bench/published_runs.py
--markdown` prints it.
"""

from __future__ import annotations

from planner.fidelity.published import (
    STEP_ERROR_GOAL,
    ErrorSummary,
    PublishedRun,
    RunResult,
    by_source,
    summarize,
)

COMMAND = "python tests/bench/published_runs.py --markdown"


def layout_label(run: PublishedRun) -> str:
    """The layout in one short line: TP8 PP16 V8 DP64 CP16 mbs1 full-AC SP ZeRO-1."""
    parts = [f"TP{run.tp}", f"PP{run.pp}"]
    if run.vpp > 1:
        parts.append(f"V{run.vpp}")
    if run.cp > 1:
        parts.append(f"CP{run.cp}")
    parts += [f"DP{run.dp}", f"mbs{run.mbs}"]
    if run.recompute != "none":
        parts.append(f"{run.recompute}-AC")
    if run.sequence_parallel and run.tp > 1:
        parts.append("SP")
    if run.zero_stage:
        parts.append(f"ZeRO-{run.zero_stage}")
    return " ".join(parts)


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _span(values: list[int], thousands: bool = True) -> str:
    low, high = min(values), max(values)
    form = "{:,}" if thousands else "{}"
    return form.format(low) if low == high else f"{form.format(low)}–{form.format(high)}"


def _summary_cells(summary: ErrorSummary) -> list[str]:
    memory = "–"
    if summary.memory_mean_abs is not None:
        memory = f"{summary.memory_mean_abs:.1%} ({summary.memory_runs})"
    return [
        str(summary.runs),
        _pct(summary.mean_abs),
        _pct(summary.mean_signed, signed=True),
        _pct(summary.max_abs),
        memory,
    ]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def source_table(results: list[RunResult]) -> list[str]:
    """Per-source and overall step-time errors, held-out runs also on their own."""
    lines = [
        _row(
            [
                "source",
                "years",
                "runtime",
                "GPU",
                "GPUs",
                "runs",
                "mean abs step error",
                "mean signed",
                "worst abs",
                "memory mean abs (runs)",
            ]
        ),
        _row(["---", "---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:"]),
    ]
    for source, group in by_source(results).items():
        runs = [r.run for r in group]
        lines.append(
            _row(
                [
                    source,
                    _span([r.year for r in runs], thousands=False),
                    ", ".join(sorted({r.runtime for r in runs})),
                    ", ".join(sorted({r.gpu for r in runs})),
                    _span([r.gpus for r in runs]),
                    *_summary_cells(summarize(group)),
                ]
            )
        )
    held = [r for r in results if r.run.held_out]
    tuned = [r for r in results if not r.run.held_out]
    all_runs = [r.run for r in results]
    span = _span([r.gpus for r in all_runs])
    lines.append(
        _row(
            [
                "**all**",
                _span([r.year for r in all_runs], thousands=False),
                "",
                "",
                span,
                *[f"**{c}**" for c in _summary_cells(summarize(results))],
            ]
        )
    )
    for label, group in (("held-out runs", held), ("other runs", tuned)):
        if group:
            lines.append(
                _row([label, "", "", "", _span([r.run.gpus for r in group]), *_summary_cells(summarize(group))])
            )
    return lines


def run_table(results: list[RunResult]) -> list[str]:
    """One line per run: layout, published and predicted step time and memory, errors."""
    lines = [
        _row(
            [
                "run",
                "source",
                "GPU × n",
                "layout",
                "published step s",
                "predicted step s",
                "step error",
                "published mem GiB",
                "predicted mem GiB",
                "memory error",
            ]
        ),
        _row(["---", "---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:"]),
    ]
    for r in results:
        run = r.run
        name = f"{run.name} (held out)" if run.held_out else run.name
        published = f"{r.published_step_time_s:.3g}" + ("" if run.step_time_s is not None else "*")
        memory = "–" if run.memory_gib is None else f"{run.memory_gib:.1f}"
        shown = r.compared_memory_gib if run.memory_gib is not None else r.peak_memory_gib
        predicted_memory = f"{shown:.1f}" + ("" if r.fits else " (over)")
        lines.append(
            _row(
                [
                    name,
                    run.source_id,
                    f"{run.gpu} × {run.gpus:,}",
                    layout_label(run),
                    published,
                    f"{r.predicted_step_time_s:.3g}",
                    _pct(r.step_error, signed=True),
                    memory,
                    predicted_memory,
                    _pct(r.memory_error, signed=True),
                ]
            )
        )
    return lines


def markdown_report(results: list[RunResult]) -> str:
    """The accuracy block: per-source table, then the per-run table."""
    overall = summarize(results)
    sources = by_source(results)
    verdict = "meets" if overall.mean_abs <= STEP_ERROR_GOAL else "misses"
    intro = [
        f"Step time predicted by `planner evaluate`'s model against {overall.runs} published runs "
        f"from {len(sources)} sources (`{COMMAND}` regenerates this block). Step error = predicted "
        "/ published − 1: negative means the prediction is too short (optimistic). Where a source "
        "gives only a throughput, the published step time (marked *) is global batch × sequence / "
        "(tokens/s per GPU × GPUs), the throughput converted through the source's own FLOP count. "
        "Runs tagged held out (every third run of each source in file order) are reported apart; "
        "in the development set they were examined too, so they are a subset, not runs the model "
        "was never developed on.",
        "",
        f"Overall mean |step error| {overall.mean_abs:.1%} ({verdict} the {STEP_ERROR_GOAL:.0%} goal), "
        f"mean signed {overall.mean_signed:+.1%}, worst {overall.max_abs:.1%}.",
        "",
    ]
    return "\n".join(intro + source_table(results) + [""] + run_table(results)) + "\n"
