"""`planner report plan.json -o plan.html`, and the `--report` of `planner plan`: the plan's
shareable HTML page, re-simulated from the plan file's model, cluster and recorded inputs."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import typer

from planner.api import document_request
from planner.cli import options as opt
from planner.cli.app import app, stdout
from planner.cli.report import cut_sizes, cuts_text, recompute_text, runs_on_text
from planner.cost.model import CostModel
from planner.cost.options import MoeOptions
from planner.errors import ConfigError
from planner.job import build
from planner.layout import layout_from_entry
from planner.output import refuse_existing, write_atomic
from planner.plan import PlanEntry, PlanFile, parse_plan_file
from planner.report.html import Table
from planner.request import Request, command_text, option_flag
from planner.run_length import run_length
from planner.search.runtimes import restrict, runtime_check
from planner.search.search import Found
from planner.search.space import SearchSpace
from planner.spec import ModelSpec
from planner.units import GiB

REPORT = typer.Option(
    None, "--report", help="Also write the plan's report, one self-contained HTML page (needs the `report` extra)."
)
TOKENS = typer.Option(None, "--tokens", help="With --report: tokens to train on, for days, GPU-hours and cost.", min=1)
GPU_HOUR_PRICE = typer.Option(
    None, "--gpu-hour-price", help="With --tokens: price of one GPU-hour, for the cost.", min=0
)
PREDICTION_TOLERANCE = 0.01
"""Relative step-time difference above which the report says the re-simulation disagrees
with the file (the cost model changed since the file was written, or a profile is missing)."""


PLAN_COLUMNS = (
    "#",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "etp",
    "schedule",
    "V",
    "mbs",
    "M",
    "recompute",
    "sp",
    "zero",
    "cuts",
    "step s",
    "tokens/s",
    "MFU",
    "bubble",
    "mem GiB",
    "runs on",
)


def plans_rows(entries: list[PlanEntry]) -> Table:
    """The plan table (as `planner plan` prints it: `ep` and `etp` for an MoE model, cuts in
    run-length form with the full list as the cell's title), the best plan highlighted."""
    moe = any(e.etp is not None for e in entries)
    columns = PLAN_COLUMNS if moe else tuple(c for c in PLAN_COLUMNS if c not in ("ep", "etp"))
    rows = []
    for rank, e in enumerate(entries, start=1):
        p = e.predicted
        figures = (
            ("-",) * 5
            if p is None
            else (
                f"{p.step_time_s:.3f}",
                f"{p.tokens_per_s:,.0f}",
                f"{p.mfu:.1%}",
                f"{p.bubble_fraction:.1%}",
                f"{max(p.memory_gb_per_stage):.1f}",
            )
        )
        experts = (str(e.ep), str(e.etp or 1)) if moe else ()
        rows.append(
            (
                str(rank),
                str(e.tp),
                str(e.pp),
                str(e.dp),
                str(e.cp),
                *experts,
                e.schedule,
                str(e.vpp),
                str(e.mbs),
                str(e.num_microbatches),
                recompute_text(e),
                "y" if e.sequence_parallel else "n",
                str(e.zero_stage),
                run_length(cut_sizes(e)),
                *figures,
                runs_on_text(e.runtimes),
            )
        )
    titles = tuple({"cuts": cuts_text(e)} for e in entries)
    return Table(
        columns, tuple(rows), frozenset({"schedule", "recompute", "cuts", "runs on"}), highlight=0, titles=titles
    )


def explain_rows(items) -> Table:
    """`plan --explain`'s table: one row per single-dimension change of the best plan."""
    from planner.search.explain import layout_text

    rows = []
    for item in items:
        if item.found is None:
            rows.append((item.change, "-", "-", "-", "-", item.reason))
            continue
        p = item.found.prediction
        rows.append(
            (
                item.change,
                layout_text(item.found.layout),
                f"{p.step_time_s:.3f}",
                f"{p.mfu:.1%}",
                f"{p.peak_memory_bytes / GiB:.1f}",
                item.reason,
            )
        )
    return Table(
        ("change", "its best layout", "step s", "MFU", "mem GiB", "why it lost"),
        tuple(rows),
        frozenset({"change", "its best layout", "why it lost"}),
    )


def cost_model_of(document: PlanFile) -> tuple[CostModel, Request, list[str]]:
    """The cost model the plan file was made with, its request, and notes on what could not be
    recreated."""
    if document.model is None or document.cluster is None:
        raise ConfigError("the plan file has no model or cluster; write it with `planner plan -o`")
    request, notes = document_request(document)
    return build(request, spec=document.model).cost_model, request, notes


def report_html(
    document: PlanFile,
    plan_path: str,
    *,
    explain: bool = True,
    tokens: float | None = None,
    gpu_hour_price: float | None = None,
    space: SearchSpace | None = None,
    accept=None,
) -> str:
    """The report page of a plan file (its best plan re-simulated); the alternatives are
    searched in `space` (default: everything the recorded runtime runs)."""
    from planner.report import require_plotly
    from planner.report.data import plan_figures, training_budget
    from planner.report.pages import plan_page

    require_plotly()
    model, request, notes = cost_model_of(document)
    best = document.plans[0]
    layout = layout_from_entry(best)
    figures = plan_figures(model, layout, best.global_batch, best.seq)
    recorded = best.predicted.step_time_s if best.predicted else None
    if recorded and abs(figures.prediction.step_time_s - recorded) > PREDICTION_TOLERANCE * recorded:
        notes.append(
            f"re-simulated step time {figures.prediction.step_time_s:.3f} s differs from the file's "
            f"{recorded:.3f} s (planner version or inputs changed)"
        )
    rows = None
    if explain:
        from planner.search.explain import alternatives

        if space is None:
            space = restrict(SearchSpace(), request.runtime) if request.runtime else SearchSpace()
            accept = (
                runtime_check(request.runtime, model.spec, model.cluster, best.global_batch, best.seq, model.options)
                if request.runtime
                else None
            )
        rows = explain_rows(
            alternatives(model, Found(layout, figures.prediction), best.global_batch, best.seq, space, accept)
        )
    budget = (
        None
        if tokens is None
        else training_budget(
            tokens, best.global_batch, best.seq, figures.prediction.step_time_s, best.num_gpus, gpu_hour_price
        )
    )
    lines = [command_text(["planner", "plan", *request.cluster_flags(), *pricing_flags(request, model.spec)])]
    return plan_page(
        document,
        figures,
        plans=plans_rows(document.plans),
        plan_path=plan_path,
        explain=rows,
        budget=budget,
        price=gpu_hour_price,
        inputs=lines,
        notes=notes,
    )


def pricing_flags(request: Request, spec: ModelSpec) -> list[str]:
    """The flags of the request's cost options that price this model (a dense model: none of
    the MoE options)."""
    moe = {option.name for option in fields(MoeOptions)}
    return [
        word
        for name, value in request.options.items()
        if spec.is_moe or name not in moe
        for word in option_flag(name, value)
    ]


@app.command("report")
def report_command(
    plan: Path = typer.Argument(..., help="Plan file written by `planner plan -o` (JSON)."),
    out: Path = typer.Option(Path("plan.html"), "--out", "-o", help="The HTML page to write."),
    tokens: float | None = TOKENS,
    gpu_hour_price: float | None = GPU_HOUR_PRICE,
    explain: bool = typer.Option(True, "--explain/--no-explain", help="Search why nearby alternatives lost."),
    force: bool = opt.FORCE,
) -> None:
    """Write one self-contained HTML page for a plan file: the plans, why alternatives lost,
    the best plan's timeline, memory and step-time breakdown, budget and export commands."""
    refuse_existing(out, force=force)
    try:
        text = plan.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read plan file {plan}: {exc.strerror}") from None
    document = parse_plan_file(text, str(plan))
    write_atomic(
        out,
        report_html(document, str(plan), explain=explain, tokens=tokens, gpu_hour_price=gpu_hour_price),
        what="report",
    )
    stdout.print(f"wrote {out}", markup=False, highlight=False)
