"""`planner sweep`: the best plan as the GPU count, the global batch or the sequence varies."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from planner.cli import options as opt
from planner.cli.app import app, print_json, stderr, stdout
from planner.cli.plan import build_space
from planner.cli.sweep_plot import line_chart
from planner.errors import LayoutError, PlannerError
from planner.layout import entry_from_layout
from planner.search.explain import layout_text
from planner.search.runtimes import runtime_check, runtime_cost_options
from planner.search.search import search
from planner.units import GiB

VARIABLES = ("gpus", "global-batch", "seq")


@app.command("sweep")
def sweep_command(
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
    runtime: str | None = typer.Option(None, "--runtime"),
    gpus_per_node: int | None = opt.GPUS_PER_NODE,
    max_memory_gb: float | None = opt.MAX_MEMORY,
    profile: Path | None = opt.PROFILE,
    calibration: Path | None = opt.CALIBRATION,
    svg: Path | None = typer.Option(None, "--svg", help="Also draw tokens/s and MFU against the varied input."),
    as_json: bool = opt.JSON,
) -> None:
    """Search the best plan for each value of one input, e.g. to choose a cluster size."""
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
    calibrated = opt.load_calibration(calibration)
    space = build_space(opt.int_list(tp, "--tp"), opt.int_list(pp, "--pp"), None, None, opt.int_list(mbs, "--mbs"),
                        opt.name_list(schedules), None, True, None, None, runtime)
    rows = []
    for value in points:
        job = {**fixed, vary: value}
        cluster = opt.build_cluster(gpu, job["gpus"], gpus_per_node, None, None, max_memory_gb, calibrated)
        cost_model = opt.build_cost_model(spec, cluster, profile, runtime_cost_options(runtime))
        source = opt.cost_source(cost_model, calibrated)
        accept = runtime_check(runtime, spec, cluster, job["global-batch"], job["seq"]) if runtime else None
        if stderr.is_terminal:
            stderr.print(f"{vary} = {value} ...", markup=False, highlight=False, end="\r")
        try:
            result = search(cost_model, job["global-batch"], job["seq"], space, top=1, accept=accept)
        except PlannerError as exc:
            rows.append((value, job, None, str(exc)))
            continue
        best = result.plans[0] if result.plans else None
        rows.append((value, job, best, None if best else
                     f"nothing fits (smallest need {result.smallest_need_bytes / GiB:.1f} GiB)"))
    if as_json:
        print_json(json.dumps({"vary": vary, "cost_source": source, "points": [_point(value, job, best, note)
                                                         for value, job, best, note in rows]}, indent=2))
    else:
        stdout.print(_table(f"{spec.name} ({source} costs)", vary, rows))
    if svg is not None:
        tokens = [best.prediction.tokens_per_s / job["gpus"] if best else None for _, job, best, _ in rows]
        mfu = [best.prediction.mfu * 100 if best else None for _, _, best, _ in rows]
        svg.write_text(line_chart(f"{spec.name}: best plan as {vary} varies", vary, list(points),
                                  [("tokens/s per GPU", "#1f77b4", tokens), ("MFU %", "#d62728", mfu)]))
        if not as_json:
            stdout.print(f"wrote {svg}", markup=False, highlight=False)


def _point(value, job, best, note) -> dict:
    if best is None:
        return {"value": value, "plan": None, "note": note}
    entry = entry_from_layout(best.layout, job["global-batch"], job["seq"], best.prediction.to_predicted())
    return {"value": value, "plan": entry.model_dump(mode="json")}


def _table(model: str, vary: str, rows) -> Table:
    table = Table(title=f"{model}: best plan per {vary}", title_justify="left")
    for column in (vary, "best layout", "step s", "tokens/s", "tokens/s/GPU", "MFU", "mem GiB"):
        table.add_column(column, justify="left" if column == "best layout" else "right")
    for value, job, best, note in rows:
        if best is None:
            table.add_row(str(value), note, "-", "-", "-", "-", "-")
            continue
        p = best.prediction
        table.add_row(str(value), layout_text(best.layout), f"{p.step_time_s:.3f}", f"{p.tokens_per_s:,.0f}",
                      f"{p.tokens_per_s / job['gpus']:,.0f}", f"{p.mfu:.1%}", f"{p.peak_memory_bytes / GiB:.1f}")
    return table
