"""The two report pages' contents: a plan file's report and a sweep's report, from values
(the plan file, the re-simulated figures, the explain rows, the budget) to HTML text."""

from __future__ import annotations

from planner.plan import PlanEntry, PlanFile
from planner.report import charts
from planner.report.data import PlanFigures, TrainingBudget
from planner.report.html import Table, chart_div, page, paragraph, preformatted, table_html

CUTS_LEGEND = "layers per virtual stage in model order, 3×20 = 20 stages of 3 layers (hover for the full list)"


def budget_rows(budget: TrainingBudget, price: float | None) -> Table:
    """Days, GPU-hours and cost of training the token count."""
    rows = [
        ("tokens", f"{budget.tokens:,.0f}"),
        ("steps", f"{budget.steps:,.0f}"),
        ("days to train", f"{budget.days:,.1f}"),
        ("GPU-hours", f"{budget.gpu_hours:,.0f}"),
    ]
    if budget.cost is not None:
        rows.append((f"cost at {price:g} per GPU-hour", f"{budget.cost:,.0f}"))
    return Table(("item", "value"), tuple(rows), frozenset({"item"}))


def export_commands(plan_path: str, entry: PlanEntry) -> list[str]:
    """`planner export` for every runtime that runs the best plan as it is."""
    return [f"planner export {plan_path} --to {name} -o export-{name}" for name in entry.runtimes or []]


def plan_page(
    document: PlanFile,
    figures: PlanFigures,
    *,
    plans: Table,
    plan_path: str,
    explain: Table | None,
    budget: TrainingBudget | None,
    price: float | None,
    inputs: list[str],
    notes: list[str],
) -> str:
    """The plan report: the plans (`plans`, the file's plans as a table), why alternatives
    lost, the best plan's timeline, memory and step-time breakdown, the training budget, the
    export commands and the inputs."""
    best = document.plans[0]
    model = document.model.name if document.model else "model"
    cluster = document.cluster
    where = f"{cluster.num_gpus} x {cluster.gpu}" if cluster else ""
    title = f"{model} on {where}: global batch {best.global_batch} x seq {best.seq}"
    sections = [
        (
            "Plans",
            table_html(plans, element_id="plans")
            + paragraph(f"costs: {document.cost_source}; cuts: {CUTS_LEGEND}", note=True),
        )
    ]
    if explain is not None:
        sections.append(("Why not something else", table_html(explain)))
    sections += [
        (
            "Timeline of the best plan (one step)",
            paragraph(
                "Each pipeline rank's actions with this plan's own per-chunk costs; drag to zoom, "
                "double-click to reset, hover an action for its micro-batch, chunk and layers.",
                note=True,
            )
            + chart_div("timeline"),
        ),
        ("Memory per pipeline rank", chart_div("memory") + chart_div("activations")),
        ("Step time", interval_paragraph(best) + chart_div("breakdown")),
    ]
    if budget is not None:
        sections.append(("Training budget", table_html(budget_rows(budget, price))))
    commands = export_commands(plan_path, best)
    sections.append(
        (
            "Export",
            preformatted(commands)
            if commands
            else paragraph("no exporter takes this plan as it is (see the runs-on column)"),
        )
    )
    sections.append(
        (
            "Inputs",
            preformatted(inputs + [f"planner {document.planner_version}"])
            + "".join(paragraph(n, note=True) for n in notes),
        )
    )
    p = figures.prediction
    return page(
        f"planner report: {title}",
        sections,
        {
            "timeline": charts.timeline_figure(
                figures, f"step {p.step_time_s * 1e3:,.0f} ms, bubble {p.bubble_fraction:.1%}, MFU {p.mfu:.1%}"
            ),
            "memory": charts.memory_figure(figures, "peak memory per pipeline rank"),
            "activations": charts.activation_figure(figures, "saved activations over the step"),
            "breakdown": charts.breakdown_figure(p.time_breakdown_s, "where the step time goes"),
        },
    )


def interval_paragraph(entry: PlanEntry) -> str:
    """What runs comparable to the plan measured, as the plan file records it ('' without)."""
    p = entry.predicted
    if p is None or not p.step_time_interval_s:
        return ""
    low, high = p.step_time_interval_s
    return paragraph(
        f"predicted step {p.step_time_s:.3f} s; runs like it measured {low:.3f} to {high:.3f} s ({p.interval_basis})"
    )


def sweep_page(title: str, vary: str, values: list[int], points: list[dict | None], second: str, table: Table) -> str:
    """The sweep report: the chart of the best plan per value, and its table."""
    return page(
        f"planner sweep: {title}",
        [("Best plan per " + vary, chart_div("sweep") + table_html(table))],
        {"sweep": charts.sweep_figure(title, vary, values, points, second)},
    )
