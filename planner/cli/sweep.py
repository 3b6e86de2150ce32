"""`planner sweep`: the best plan as the GPU count, the global batch or the sequence varies."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from planner.api import Evaluation, cost_source_text, plan_document
from planner.cli import options as opt
from planner.cli.app import app, print_json, stderr, stdout
from planner.cli.report import plans_view, runs_on_text
from planner.cli.sweep_plot import chart_points, sweep_html, sweep_svg
from planner.errors import LayoutError, PlannerError
from planner.job import build
from planner.output import refuse_existing, write_atomic
from planner.report import require_plotly
from planner.report.html import Table as HtmlTable
from planner.search.explain import layout_text
from planner.search.runtimes import runtime_check
from planner.search.search import SearchResult, search
from planner.units import GiB

VARIABLES = ("gpus", "global-batch", "seq")
MOVABLE_COLUMNS = ("runs on", "cuts", "tokens/s/GPU", "tokens/s")
"""The sweep table's columns moved under it, in this order, while it is wider than the
terminal: throughput, what the sweep compares, stays longest."""


@app.command("sweep")
def sweep_command(
    ctx: typer.Context,
    model: str = opt.MODEL,
    gpus: int = typer.Option(0, "--gpus", "-n", help="GPUs (unless varied)."),
    gpu: str = opt.GPU,
    global_batch: int = typer.Option(0, "--global-batch", "-b", help="Global batch (unless varied)."),
    seq: int = typer.Option(0, "--seq", "-s", help="Sequence length (unless varied)."),
    vary: str = typer.Option(..., "--vary", help="What varies: gpus, global-batch or seq."),
    values: str = typer.Option(..., "--values", help="Its values, comma-separated, e.g. 256,512,1024."),
    tp: str | None = typer.Option(None, "--tp"),
    pp: str | None = typer.Option(None, "--pp"),
    mbs: str | None = typer.Option(None, "--mbs"),
    schedules: str | None = typer.Option(None, "--schedules"),
    runtime: str | None = opt.RUNTIME,
    sets: list[str] | None = opt.SET,
    precision: str | None = opt.PRECISION,
    moe_imbalance: float | None = opt.MOE_IMBALANCE,
    moe_dispatcher: str | None = opt.MOE_DISPATCHER,
    moe_ep_overlap: bool | None = opt.MOE_EP_OVERLAP,
    gpus_per_node: int | None = opt.GPUS_PER_NODE,
    max_memory_gb: float | None = opt.MAX_MEMORY,
    memory_headroom: float | None = opt.MEMORY_HEADROOM,
    profile: Path | None = opt.PROFILE,
    attention: str | None = opt.ATTENTION,
    cuda_graphs: bool | None = opt.CUDA_GRAPHS,
    interference: bool | None = opt.INTERFERENCE,
    stragglers: bool | None = opt.STRAGGLERS,
    speed_spread: str | None = opt.SPEED_SPREAD,
    profile_only: bool = opt.PROFILE_ONLY,
    calibration: Path | None = opt.CALIBRATION,
    svg: Path | None = typer.Option(
        None,
        "--svg",
        help="Also draw the best plan per value as an SVG "
        "(needs the `report` extra and a Chrome/Chromium for kaleido).",
    ),
    report: Path | None = typer.Option(
        None,
        "--report",
        help="Also write the chart and table as one self-contained HTML page (needs the `report` extra).",
    ),
    force: bool = opt.FORCE,
    as_json: bool = opt.JSON,
) -> None:
    """Search the best plan for each value of one input: the GPU count, the global batch or the sequence."""
    if svg is not None or report is not None:
        require_plotly()
    refuse_existing(svg, report, force=force)
    if vary not in VARIABLES:
        raise LayoutError(f"--vary must be one of {', '.join(VARIABLES)}, got '{vary}'")
    points = opt.int_list(values, "--values")
    if not points or 0 in points:
        raise LayoutError("--values needs at least one positive integer")
    fixed = {"gpus": gpus, "global-batch": global_batch, "seq": seq}
    for name, value in fixed.items():
        if name != vary and value <= 0:
            raise LayoutError(f"--{name} is required (only --{vary} is varied)")
    spec = opt.load_model(model)
    space = opt.space_from(ctx.params)
    rows = []
    for value in points:
        job = {**fixed, vary: value}
        built = build(
            opt.request_from(ctx.params, gpus=job["gpus"], global_batch=job["global-batch"], seq=job["seq"]),
            spec,
        )
        cluster, cost_model = built.cluster, built.cost_model
        source = cost_source_text(built)
        accept = opt.accept_checks(
            runtime_check(runtime, spec, cluster, job["global-batch"], job["seq"], cost_model.options)
            if runtime
            else None,
            opt.profile_check(cost_model, job["seq"], profile_only),
        )
        if stderr.is_terminal:
            stderr.print(f"{vary} = {value} ...", markup=False, highlight=False, end="\r")
        try:
            result = search(cost_model, job["global-batch"], job["seq"], space, top=1, accept=accept)
        except PlannerError as exc:
            rows.append((value, job, None, None, str(exc)))
            continue
        best = result.plans[0] if result.plans else None
        entry = (
            None
            if best is None
            else plan_document(
                built,
                [
                    Evaluation(job=built, layout=best.layout, prediction=best.prediction)
                    .entry()
                    .model_copy(update={"cost_sources": opt.cost_sources(cost_model, best.layout, job["seq"])})
                ],
            ).plans[0]
        )
        rows.append((value, job, best, entry, None if best else _why_none(result, runtime)))
    if as_json:
        print_json(
            json.dumps(
                {
                    "vary": vary,
                    "cost_source": source,
                    "points": [_point(value, entry, note) for value, _, _, entry, note in rows],
                },
                indent=2,
            )
        )
    else:
        print_table(f"{spec.name} ({source} costs): best plan per {vary}", vary, rows, profile is not None)
    title = f"{spec.name} on {gpu}: best plan as {vary} varies ({source} costs)"
    values, plotted = list(points), chart_points(rows)
    for path, draw in (
        (svg, lambda: sweep_svg(title, vary, values, plotted)),
        (report, lambda: sweep_html(title, vary, values, plotted, _html_table(vary, rows))),
    ):
        if path is not None:
            write_atomic(path, draw())
            if not as_json:
                stdout.print(f"wrote {path}", markup=False, highlight=False)


def _why_none(result: SearchResult, runtime: str | None) -> str:
    """Why a point has no plan, in a few words."""
    if result.stats.candidates == 0:
        return "no layout: the GPUs or the batch do not divide"
    if dropped := result.runtime_rejections.get(opt.PROFILE_ONLY_REASON, 0):
        return f"--profile-only dropped the {dropped:,} layouts that fit"
    if result.stats.rejected_by_runtime:
        return f"{runtime} runs none of the layouts that fit"
    return f"nothing fits (smallest need {result.smallest_need_bytes / GiB:.1f} GiB)"


def _point(value, entry, note) -> dict:
    if entry is None:
        return {"value": value, "plan": None, "note": note}
    return {"value": value, "plan": entry.model_dump(mode="json")}


def _html_table(vary: str, rows) -> HtmlTable:
    """The sweep table for the report page."""
    cells = []
    for value, job, best, entry, note in rows:
        if best is None:
            cells.append((str(value), note, "-", "-", "-", "-", "-", "-"))
            continue
        p = best.prediction
        cells.append(
            (
                str(value),
                layout_text(best.layout),
                f"{p.step_time_s:.3f}",
                f"{p.tokens_per_s:,.0f}",
                f"{p.tokens_per_s / job['gpus']:,.0f}",
                f"{p.mfu:.1%}",
                f"{p.peak_memory_bytes / GiB:.1f}",
                runs_on_text(entry.runtimes),
            )
        )
    return HtmlTable(
        (vary, "best layout", "step s", "tokens/s", "tokens/s/GPU", "MFU", "mem GiB", "runs on"),
        tuple(cells),
        frozenset({"best layout", "runs on"}),
    )


def print_table(title: str, vary: str, rows, profiled: bool) -> None:
    """The best plan per value as `plan` shows plans, keyed by the value; then the values
    without a plan and, with a profile, where each plan's costs came from."""
    found = [(value, entry) for value, _, best, entry, _ in rows if best is not None]
    if found:
        stdout.print(
            plans_view(
                [entry for _, entry in found],
                title,
                stdout.width,
                keys=(vary, [str(value) for value, _ in found]),
                per_gpu=True,
                movable=MOVABLE_COLUMNS,
            ),
            soft_wrap=False,
        )
    for value, _, best, entry, note in rows:
        if best is None:
            stdout.print(f"{vary} {value}: {note}", markup=False, highlight=False, soft_wrap=False)
        elif profiled:
            stdout.print(
                f"costs of {vary} {value}: {opt.sources_text(entry.cost_sources)}",
                markup=False,
                highlight=False,
                soft_wrap=False,
            )
